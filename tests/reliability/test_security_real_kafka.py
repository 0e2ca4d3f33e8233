"""TLS and SASL against the real Apache Kafka broker: one single-node KafkaCluster with secured
listeners, certificates made by the test with the ``openssl`` tool.

Listeners: ``TLS`` (SSL), ``MTLS`` (SSL, client certificate required) and ``SECURE``
(SASL_SSL with PLAIN, SCRAM-SHA-512 and Kafka's unsecured OAUTHBEARER; OAUTHBEARER sessions
last at most 10 s, so clients must re-authenticate, KIP-368). For every mode an SDK consumer
and a confluent-kafka ``group.protocol=consumer`` consumer with the same settings share one
group: the group connection and the fetch connection both go through the secured listener,
and the two members split the partitions and read every record once.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as CkConsumer
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from consumer_sdk import Consumer
from consumer_sdk.config import ConsumerConfig
from consumer_sdk.testing import close_client, wait_until
from consumer_sdk.testing.tls_proxy import Certificates, make_certificates

KafkaCluster: Any
try:
    from consumer_sdk.testing.kafka_cluster import KafkaCluster
except ImportError:  # pragma: no cover - the helper ships with the SDK
    KafkaCluster = None

PW = "ks-Pa55-word"
PLAIN_USER, PLAIN_PASSWORD = "alice", "alice-Pa55-word"
SCRAM_USER, SCRAM_PASSWORD = "carol", "carol-Pa55-word"
WRONG = "wrong-Pa55-word"
REAUTH_MS = 10_000


def _unavailable() -> str | None:
    if KafkaCluster is None:
        return "consumer_sdk.testing.kafka_cluster is not available"
    if not os.environ.get("KAFKA_HOME"):
        return "KAFKA_HOME is not set (point it at a Kafka >= 4.0 distribution)"
    if shutil.which("openssl") is None:
        return "the openssl command line tool is missing"
    return None


pytestmark = [pytest.mark.realkafka, pytest.mark.timeout(900)]


@dataclass
class Secured:
    cluster: Any
    certs: Certificates
    client_cert: Path
    client_key: Path
    client_p12: Path

    def bootstrap(self, listener: str) -> str:
        return str(self.cluster.bootstrap_for(listener))


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _client_certificate(d: Path, certs: Certificates) -> tuple[Path, Path, Path]:
    """A client certificate signed by the test CA (PEM pair and a PKCS#12 keystore)."""
    ca_key = certs.ca.with_suffix(".key")
    key, csr, cert, p12 = d / "client.key", d / "client.csr", d / "client.pem", d / "client.p12"
    _openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(csr),
        "-subj",
        "/CN=sdk-client",
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(certs.ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-out",
        str(cert),
        "-days",
        "2",
    )
    _openssl(
        "pkcs12",
        "-export",
        "-in",
        str(cert),
        "-inkey",
        str(key),
        "-out",
        str(p12),
        "-passout",
        f"pass:{PW}",
        "-name",
        "client",
    )
    return cert, key, p12


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    reason = _unavailable()
    if reason is not None:
        print(f"real-Kafka security tier skipped: {reason}")
        pytest.skip(reason)
    d = tmp_path_factory.mktemp("real-security")
    certs = make_certificates(d, ("localhost",), name="broker")
    server_p12 = d / "broker.p12"
    _openssl(
        "pkcs12",
        "-export",
        "-in",
        str(certs.cert),
        "-inkey",
        str(certs.key),
        "-out",
        str(server_p12),
        "-passout",
        f"pass:{PW}",
        "-name",
        "broker",
    )
    client_cert, client_key, client_p12 = _client_certificate(d, certs)
    module = "org.apache.kafka.common.security"
    props = {
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": server_p12,
        "ssl.keystore.password": PW,
        "ssl.key.password": PW,
        "listener.name.mtls.ssl.client.auth": "required",
        "listener.name.mtls.ssl.truststore.type": "PEM",
        "listener.name.mtls.ssl.truststore.location": certs.ca,
        "listener.name.secure.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512,OAUTHBEARER",
        "listener.name.secure.plain.sasl.jaas.config": (
            f'{module}.plain.PlainLoginModule required user_{PLAIN_USER}="{PLAIN_PASSWORD}";'
        ),
        "listener.name.secure.scram-sha-512.sasl.jaas.config": (
            f"{module}.scram.ScramLoginModule required;"
        ),
        "listener.name.secure.oauthbearer.sasl.jaas.config": (
            f"{module}.oauthbearer.OAuthBearerLoginModule required "
            'unsecuredLoginStringClaim_sub="admin";'
        ),
        "listener.name.secure.oauthbearer.connections.max.reauth.ms": REAUTH_MS,
    }
    cluster = KafkaCluster(
        1,
        listeners={"TLS": "SSL", "MTLS": "SSL", "SECURE": "SASL_SSL"},
        server_properties=props,
        advertised_host="localhost",
        heartbeat_interval_ms=500,
        session_timeout_ms=6000,
    )
    try:
        # SCRAM credentials live in the metadata log: created through the PLAINTEXT listener.
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
        futures = cluster.admin().alter_user_scram_credentials(
            [UserScramCredentialUpsertion(SCRAM_USER, info, SCRAM_PASSWORD.encode())]
        )
        for future in futures.values():
            future.result(30)
        yield Secured(cluster, certs, client_cert, client_key, client_p12)
    finally:
        cluster.close()


# -- helpers ----------------------------------------------------------------------------------


def unsecured_token(principal: str, life_s: int = 3600) -> tuple[str, float]:
    """An unsecured JWS (``alg: none``), as Kafka's unsecured validator accepts."""

    def b64(obj: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    now = int(time.time())
    token = f"{b64({'alg': 'none'})}.{b64({'sub': principal, 'iat': now, 'exp': now + life_s})}."
    return token, float(now + life_s)


def _topic(secure: Secured, partitions: int = 2) -> str:
    name = f"sec-{uuid.uuid4().hex[:8]}"
    secure.cluster.create_topic(name, partitions)
    return name


def _produce(secure: Secured, topic: str, prefix: str, count: int = 6) -> set[bytes]:
    values = [f"{prefix}-{i}".encode() for i in range(count)]
    for partition in (0, 1):
        secure.cluster.produce(topic, values[partition::2], partition=partition)
    return set(values)


def _poll_records(client: Any, sink: dict[bytes, int], errors: list[KafkaError]) -> None:
    try:
        msg = client.poll(0.1)
    except KafkaException as exc:
        errors.append(exc.args[0])
        return
    if msg is None:
        return
    if msg.error() is not None:
        if msg.error().code() != KafkaError._PARTITION_EOF:
            errors.append(msg.error())
        return
    sink[msg.value()] = msg.partition()


def pair_in_one_group(secure: Secured, listener: str, settings: dict[str, Any]) -> None:
    """An SDK consumer and a confluent-kafka KIP-848 consumer with the same settings join one
    group on ``listener``, split the partitions, and read every record exactly once."""
    topic = _topic(secure)
    group = f"g-{topic}"
    base = {
        "bootstrap.servers": secure.bootstrap(listener),
        "group.id": group,
        "auto.offset.reset": "earliest",
        **settings,
    }
    sdk = Consumer(dict(base))
    ck = CkConsumer({**base, "group.protocol": "consumer"})
    sdk_records: dict[bytes, int] = {}
    ck_records: dict[bytes, int] = {}
    errors: list[KafkaError] = []
    try:
        sdk.subscribe([topic])
        ck.subscribe([topic])

        def split() -> bool:
            _poll_records(sdk, sdk_records, errors)
            _poll_records(ck, ck_records, errors)
            mine = {tp.partition for tp in sdk.assignment()}
            theirs = {tp.partition for tp in ck.assignment()}
            return len(mine) == 1 and len(theirs) == 1 and mine | theirs == {0, 1}

        what = f"both members own one partition ({listener})"
        wait_until(split, timeout=90, interval=0, description=what)
        assert errors == [], errors
        expected = _produce(secure, topic, "rec")

        def all_read() -> bool:
            _poll_records(sdk, sdk_records, errors)
            _poll_records(ck, ck_records, errors)
            return set(sdk_records) | set(ck_records) == expected

        wait_until(all_read, timeout=60, interval=0, description=f"every record read ({listener})")
        assert errors == [], errors
        assert not set(sdk_records) & set(ck_records), "a record was read by both members"
        (mine,) = {tp.partition for tp in sdk.assignment()}
        assert sdk_records and set(sdk_records.values()) == {mine}
        assert ck_records and mine not in set(ck_records.values())
    finally:
        assert close_client(ck)
        sdk.close()


def failing_consumer(conf: dict[str, Any]) -> tuple[Consumer, list[KafkaError]]:
    """A consumer whose ``error_cb`` collects into the returned list."""
    errors: list[KafkaError] = []
    return Consumer({**conf, "error_cb": errors.append}), errors


def first_error(
    consumer: Consumer, errors: list[KafkaError], timeout: float = 30.0
) -> tuple[KafkaError, float]:
    """The first connection error of the SDK's own group connection given to ``error_cb``
    (the fetcher's librdkafka reports its own as well), and when it came. As confluent-kafka,
    poll() neither raises it nor returns it."""
    start = time.monotonic()

    def failed() -> bool:
        msg = consumer.poll(0.1)
        assert msg is None or msg.error() is None, msg.error()
        return any(e.str().startswith("cannot connect to the cluster") for e in errors)

    wait_until(failed, timeout=timeout, interval=0, description="error_cb reporting the error")
    found = next(e for e in errors if e.str().startswith("cannot connect to the cluster"))
    return found, time.monotonic() - start


# -- TLS --------------------------------------------------------------------------------------


def test_tls_with_hostname_verification(secure: Secured) -> None:
    pair_in_one_group(
        secure, "TLS", {"security.protocol": "SSL", "ssl.ca.location": str(secure.certs.ca)}
    )


def test_tls_wrong_hostname_is_refused_with_a_clear_error(secure: Secured) -> None:
    """The broker's certificate names localhost; connecting to 127.0.0.1 must fail hostname
    verification (on by default, ssl.endpoint.identification.algorithm=https)."""
    port = secure.bootstrap("TLS").rsplit(":", 1)[1]
    consumer, conn_errors = failing_consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": "g-wrong-host",
            "security.protocol": "SSL",
            "ssl.ca.location": str(secure.certs.ca),
        }
    )
    try:
        consumer.subscribe(["any"])
        error, elapsed = first_error(consumer, conn_errors)
        print(f"TLS hostname failure reported to error_cb after {elapsed:.2f}s")
        assert error.code() == KafkaError._SSL
        assert "certificate verification failed" in error.str()
        assert "127.0.0.1" in error.str() and "mismatch" in error.str()
    finally:
        consumer.close()


def test_mutual_tls_with_pem_strings(secure: Secured) -> None:
    pair_in_one_group(
        secure,
        "MTLS",
        {
            "security.protocol": "SSL",
            "ssl.ca.pem": secure.certs.ca.read_text(),
            "ssl.certificate.pem": secure.client_cert.read_text(),
            "ssl.key.pem": secure.client_key.read_text(),
        },
    )


def test_mutual_tls_with_a_pkcs12_keystore(secure: Secured) -> None:
    pair_in_one_group(
        secure,
        "MTLS",
        {
            "security.protocol": "SSL",
            "ssl.ca.location": str(secure.certs.ca),
            "ssl.keystore.location": str(secure.client_p12),
            "ssl.keystore.password": PW,
        },
    )


def test_mutual_tls_without_a_client_certificate_fails(secure: Secured) -> None:
    consumer, conn_errors = failing_consumer(
        {
            "bootstrap.servers": secure.bootstrap("MTLS"),
            "group.id": "g-no-cert",
            "security.protocol": "SSL",
            "ssl.ca.location": str(secure.certs.ca),
        }
    )
    try:
        consumer.subscribe(["any"])
        error, _ = first_error(consumer, conn_errors)
        assert error.code() == KafkaError._SSL, error
        assert "client certificate" in error.str()
    finally:
        consumer.close()


# -- SASL -------------------------------------------------------------------------------------


def _sasl(secure: Secured, mechanism: str, **extra: Any) -> dict[str, Any]:
    return {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(secure.certs.ca),
        "sasl.mechanism": mechanism,
        **extra,
    }


def test_sasl_plain(secure: Secured) -> None:
    pair_in_one_group(
        secure,
        "SECURE",
        _sasl(secure, "PLAIN", **{"sasl.username": PLAIN_USER, "sasl.password": PLAIN_PASSWORD}),
    )


def test_sasl_scram_sha_512(secure: Secured) -> None:
    pair_in_one_group(
        secure,
        "SECURE",
        _sasl(
            secure,
            "SCRAM-SHA-512",
            **{"sasl.username": SCRAM_USER, "sasl.password": SCRAM_PASSWORD},
        ),
    )


@pytest.mark.parametrize(
    ("mechanism", "user"), [("PLAIN", PLAIN_USER), ("SCRAM-SHA-512", SCRAM_USER)]
)
def test_wrong_password_is_a_clear_error_to_error_cb(
    secure: Secured, mechanism: str, user: str
) -> None:
    consumer, conn_errors = failing_consumer(
        {
            "bootstrap.servers": secure.bootstrap("SECURE"),
            "group.id": f"g-bad-{mechanism}",
            **_sasl(secure, mechanism, **{"sasl.username": user, "sasl.password": WRONG}),
        }
    )
    try:
        consumer.subscribe(["any"])
        error, elapsed = first_error(consumer, conn_errors)
        print(f"{mechanism} wrong password reported to error_cb after {elapsed:.2f}s")
        assert error.code() == KafkaError._AUTHENTICATION
        assert f"SASL {mechanism} authentication as '{user}' failed" in error.str()
        assert WRONG not in error.str()
    finally:
        consumer.close()


def test_set_sasl_credentials_recovers_both_connections(secure: Secured) -> None:
    topic = _topic(secure)
    consumer, conn_errors = failing_consumer(
        {
            "bootstrap.servers": secure.bootstrap("SECURE"),
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "reconnect.backoff.max.ms": 1000,
            **_sasl(secure, "PLAIN", **{"sasl.username": PLAIN_USER, "sasl.password": WRONG}),
        }
    )
    try:
        consumer.subscribe([topic])
        error, _ = first_error(consumer, conn_errors)
        assert error.code() == KafkaError._AUTHENTICATION
        consumer.set_sasl_credentials(PLAIN_USER, PLAIN_PASSWORD)
        expected = _produce(secure, topic, "after")
        records: dict[bytes, int] = {}
        errors: list[KafkaError] = []
        wait_until(
            lambda: (_poll_records(consumer, records, errors), set(records) == expected)[1],
            90,
            0,
            "records read with the new credentials",
        )
        assert len(consumer.assignment()) == 2
    finally:
        consumer.close()


# -- OAUTHBEARER ------------------------------------------------------------------------------


def test_oauthbearer_with_oauth_cb_and_reauthentication(secure: Secured) -> None:
    """oauth_cb tokens for both connections; the listener's sessions last 10 s, so the group
    connection re-authenticates (KIP-368) and stays in the group at the same epoch."""
    calls: list[str | None] = []

    def oauth_cb(config: str | None) -> tuple[str, float, str]:
        calls.append(config)
        token, expiry = unsecured_token("admin", life_s=3600)
        return token, expiry, "admin"

    settings = _sasl(
        secure, "OAUTHBEARER", oauth_cb=oauth_cb, **{"sasl.oauthbearer.config": "scope=test"}
    )
    pair_in_one_group(secure, "SECURE", settings)
    assert calls and set(calls) == {"scope=test"}

    topic = _topic(secure)
    consumer = Consumer(
        {
            "bootstrap.servers": secure.bootstrap("SECURE"),
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            **settings,
        }
    )
    try:
        consumer.subscribe([topic])
        wait_until(
            lambda: (consumer.poll(0.1), len(consumer.assignment()) == 2)[1],
            timeout=60,
            interval=0,
            description="joined",
        )
        epoch = consumer.member_epoch
        deadline = time.monotonic() + REAUTH_MS / 1000 * 1.6
        while time.monotonic() < deadline:
            assert consumer.poll(0.2) is None
        reauths = sum(c.reauthentications for c in consumer._net._conns.values())
        assert reauths >= 1, "no KIP-368 re-authentication on the group connection"
        assert consumer.member_epoch == epoch and len(consumer.assignment()) == 2
        expected = _produce(secure, topic, "late")
        records: dict[bytes, int] = {}
        errors: list[KafkaError] = []
        wait_until(
            lambda: (_poll_records(consumer, records, errors), set(records) == expected)[1],
            60,
            0,
            "records after re-authentication",
        )
        assert errors == []
    finally:
        consumer.close()


def test_oauthbearer_unsecured_jwt_default(secure: Secured) -> None:
    pair_in_one_group(
        secure,
        "SECURE",
        _sasl(
            secure,
            "OAUTHBEARER",
            **{
                "enable.sasl.oauthbearer.unsecure.jwt": True,
                "sasl.oauthbearer.config": "principal=admin lifeSeconds=600",
            },
        ),
    )


def test_oauthbearer_rejected_token_is_a_clear_error(secure: Secured) -> None:
    def expired_alg(_config: str | None) -> tuple[str, float]:
        # signed with an algorithm the unsecured validator refuses
        def b64(obj: object) -> str:
            return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

        now = int(time.time())
        claims = {"sub": "admin", "iat": now, "exp": now + 600}
        return f"{b64({'alg': 'HS256'})}.{b64(claims)}.c2ln", float(now + 600)

    consumer, conn_errors = failing_consumer(
        {
            "bootstrap.servers": secure.bootstrap("SECURE"),
            "group.id": "g-badtok",
            **_sasl(secure, "OAUTHBEARER", oauth_cb=expired_alg),
        }
    )
    try:
        consumer.subscribe(["any"])
        error, elapsed = first_error(consumer, conn_errors)
        print(f"rejected OAUTHBEARER token reported to error_cb after {elapsed:.2f}s")
        assert error.code() == KafkaError._AUTHENTICATION
        assert "SASL OAUTHBEARER authentication as 'admin' failed" in error.str()
        assert "invalid_token" in error.str()
    finally:
        consumer.close()


class _TokenEndpoint(http.server.ThreadingHTTPServer):
    """A tiny OAuth 2.0 token endpoint: client-credentials grant, unsecured JWTs."""

    def __init__(self, client_id: str, secret: str) -> None:
        self.client_id, self.secret = client_id, secret
        self.requests: list[dict[str, str]] = []
        super().__init__(("127.0.0.1", 0), _TokenHandler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/token"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _TokenHandler(http.server.BaseHTTPRequestHandler):
    server: _TokenEndpoint

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        form = dict(p.split("=", 1) for p in self.rfile.read(length).decode().split("&") if p)
        expected = base64.b64encode(f"{self.server.client_id}:{self.server.secret}".encode())
        self.server.requests.append(form)
        if self.headers.get("Authorization") != f"Basic {expected.decode()}":
            self.send_response(401)
            self.end_headers()
            self.wfile.write(b'{"error":"invalid_client"}')
            return
        token, _ = unsecured_token(self.server.client_id, life_s=600)
        body = json.dumps({"access_token": token, "token_type": "bearer", "expires_in": 600})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def token_endpoint() -> Iterator[_TokenEndpoint]:
    endpoint = _TokenEndpoint("sdk-app", "app-Pa55-secret")
    try:
        yield endpoint
    finally:
        endpoint.stop()


def _oidc(secure: Secured, endpoint: _TokenEndpoint, secret: str) -> dict[str, Any]:
    return _sasl(
        secure,
        "OAUTHBEARER",
        **{
            "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.client.id": endpoint.client_id,
            "sasl.oauthbearer.client.secret": secret,
            "sasl.oauthbearer.token.endpoint.url": endpoint.url,
            "sasl.oauthbearer.scope": "kafka",
        },
    )


def test_oauthbearer_oidc_client_credentials(
    secure: Secured, token_endpoint: _TokenEndpoint
) -> None:
    settings = _oidc(secure, token_endpoint, token_endpoint.secret)
    ConsumerConfig.from_mapping({"bootstrap.servers": "localhost:1", "group.id": "g", **settings})
    assert token_endpoint.requests == [], "validating the config must not fetch a token"
    pair_in_one_group(secure, "SECURE", settings)
    grants = {(r.get("grant_type"), r.get("scope")) for r in token_endpoint.requests}
    assert grants == {("client_credentials", "kafka")}
    assert len(token_endpoint.requests) >= 2, "the group connection's and the fetcher's grants"


def test_oauthbearer_oidc_bad_client_secret(
    secure: Secured, token_endpoint: _TokenEndpoint
) -> None:
    consumer, conn_errors = failing_consumer(
        {
            "bootstrap.servers": secure.bootstrap("SECURE"),
            "group.id": "g-oidc-bad",
            **_oidc(secure, token_endpoint, WRONG),
        }
    )
    try:
        consumer.subscribe(["any"])
        error, _ = first_error(consumer, conn_errors)
        assert error.code() == KafkaError._AUTHENTICATION
        assert "HTTP 401" in error.str() and "invalid_client" in error.str()
        assert WRONG not in error.str()
    finally:
        consumer.close()


def test_cli_describe_on_a_secured_listener(
    secure: Secured, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``consumer-sdk describe`` takes the connection settings as ``-X`` and/or a properties
    file, like Kafka's tools."""
    from consumer_sdk.cli import main

    topic = _topic(secure)
    settings = _sasl(
        secure, "SCRAM-SHA-512", **{"sasl.username": SCRAM_USER, "sasl.password": SCRAM_PASSWORD}
    )
    consumer = Consumer(
        {"bootstrap.servers": secure.bootstrap("SECURE"), "group.id": f"g-{topic}", **settings}
    )
    try:
        consumer.subscribe([topic])
        wait_until(
            lambda: (consumer.poll(0.1), len(consumer.assignment()) == 2)[1], 60, 0, "joined"
        )
        props = tmp_path / "client.properties"
        props.write_text(
            "# secured\n"
            + "".join(f"{k}={v}\n" for k, v in settings.items() if k != "sasl.password")
        )
        argv = [
            "describe",
            f"g-{topic}",
            "-b",
            secure.bootstrap("SECURE"),
            "--command-config",
            str(props),
            "-X",
            f"sasl.password={SCRAM_PASSWORD}",
        ]
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert f"group g-{topic}: state" in out and f"{topic}[0,1]" in out
        assert main([*argv[:-1], f"sasl.password={WRONG}"]) == 1
        err = capsys.readouterr().err
        assert "SASL SCRAM-SHA-512 authentication as 'carol' failed" in err and WRONG not in err
        assert main([*argv, "-X", "fetch.min.bytes=1"]) == 2
        assert "fetch.min.bytes: not a connection setting" in capsys.readouterr().err
    finally:
        consumer.close()


def test_shared_network_loop_reauthenticates_and_keeps_the_members(secure: Secured) -> None:
    """Two members of one group on the shared network loop (each with its own OAUTHBEARER
    token source, so each with its own connections: a token source is an identity); the
    listener's sessions last 10 s, so every connection re-authenticates in place (KIP-368:
    requests held back, the exchange, then resumed) and both members stay in the group at the
    same epoch, with no reconnect."""
    from consumer_sdk.membership import (
        CallbackCompleted,
        CallbacksNeeded,
        Close,
        LeaveCompleted,
        MemberState,
        Subscribe,
    )
    from consumer_sdk.runtime.member_network import MemberNetwork

    def oauth_cb(config: str | None) -> tuple[str, float, str]:
        token, expiry = unsecured_token("admin", life_s=3600)
        return token, expiry, "admin"

    topic = _topic(secure)
    sasl = _sasl(secure, "OAUTHBEARER", oauth_cb=oauth_cb)
    conf = {
        "bootstrap.servers": secure.bootstrap("SECURE"),
        "group.id": f"loop-{topic}",
        "enable.auto.commit": False,
        **sasl,
    }
    first = MemberNetwork(ConsumerConfig.from_mapping(conf))
    second = MemberNetwork(ConsumerConfig.from_mapping(conf))
    nets = [first, second]
    left: set[int] = set()

    def pump() -> None:
        for i, net in enumerate(nets):
            net.note_poll()
            for event in net.drain_background_events():
                if isinstance(event, CallbacksNeeded):
                    net.submit(CallbackCompleted(event.callback_id))
                elif isinstance(event, LeaveCompleted):
                    left.add(i)

    try:
        for net in nets:
            net.submit(Subscribe(topics=(topic,)))
        wait_until(
            lambda: (pump(), all(n.state is MemberState.STABLE for n in nets))[1],
            timeout=60,
            interval=0.05,
            description="both joined",
        )
        epochs = [n.member_epoch for n in nets]
        loop = first._loop
        deadline = time.monotonic() + REAUTH_MS / 1000 * 1.6
        while time.monotonic() < deadline:
            pump()
            time.sleep(0.1)
        assert all(n.state is MemberState.STABLE for n in nets)
        assert [n.member_epoch for n in nets] == epochs
        conns = [c for c in loop.connections() if c.state == "READY"]
        # Re-authenticated in place (generation counts sockets: one, never reconnected).
        assert conns and all(c.reauthentications >= 1 for c in conns), conns
        assert all(c.generation == c.reauthentications + 1 for c in conns), conns
        assert all(c.failures == 0 for c in loop.connections())
    finally:
        for net in nets:
            net.submit(Close())
        wait_until(
            lambda: (pump(), len(left) == 2)[1], timeout=30, interval=0.05, description="both left"
        )
        for net in nets:
            net.stop()
