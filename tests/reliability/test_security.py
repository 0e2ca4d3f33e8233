"""TLS and SASL end to end: the SDK's own connections (and its librdkafka fetcher) through a
TLS-terminating, SASL-authenticating proxy in front of EmbeddedKafka, which rewrites the
advertised broker addresses so that every connection goes through it.

Certificates are generated per module with the ``openssl`` command line tool.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from consumer_sdk import Consumer, GroupMember, KafkaError, MemberState
from consumer_sdk.errors import ConfigError
from consumer_sdk.testing import EmbeddedKafka
from consumer_sdk.testing.tls_proxy import Certificates, TlsProxy, make_certificates
from tests.reliability.support import App, Callbacks, HeartbeatSpy, config, timed_close

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")

USER, PASSWORD = "alice", "s3cr3t-Pa55word-XYZ"
WRONG = "not-the-Pa55word-QRS"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Certificates]:
    d = tmp_path_factory.mktemp("certs")
    return {
        "good": make_certificates(d, ("localhost", "127.0.0.1"), name="good"),
        "other": make_certificates(d, ("localhost", "127.0.0.1"), name="other"),
        "wrong-host": make_certificates(d, ("broker.example.com",), name="wrong-host"),
    }


@pytest.fixture(scope="module")
def kafka() -> Iterator[EmbeddedKafka]:
    with EmbeddedKafka(brokers=1, heartbeat_interval_ms=300, session_timeout_ms=6000) as k:
        k.create_topic("sec", partitions=2, replication_factor=1)
        k.produce("sec", [b"r0", b"r1", b"r2", b"r3"])
        yield k


def proxy(kafka: EmbeddedKafka, certs: Certificates, sasl: bool = False) -> TlsProxy:
    return TlsProxy(
        kafka.broker_address(1),
        certs=certs,
        sasl_users={USER: PASSWORD} if sasl else None,
        advertised_host="localhost",
    )


def tls(ca: Path, **extra: Any) -> dict[str, Any]:
    return {"security_protocol": "SSL", "ssl_ca_location": str(ca), **extra}


def sasl(ca: Path, mechanism: str, password: str = PASSWORD) -> dict[str, Any]:
    return {
        "security_protocol": "SASL_SSL",
        "ssl_ca_location": str(ca),
        "sasl_mechanism": mechanism,
        "sasl_username": USER,
        "sasl_password": password,
    }


def joined(app: App) -> None:
    app.poll_until(
        lambda: app.member.state is MemberState.STABLE and len(app.member.assignment()) == 2,
        what="the member joined through the proxy",
    )


def test_tls_consumer_end_to_end(kafka: EmbeddedKafka, certs: dict[str, Certificates]) -> None:
    """Membership and the librdkafka fetcher both connect through TLS."""
    with proxy(kafka, certs["good"]) as px:
        consumer = Consumer(config(f"localhost:{px.port}", "sec-tls", **tls(certs["good"].ca)))
        app = App(consumer)
        try:
            consumer.subscribe(["sec"])
            values = sorted(app.next_record().value() for _ in range(4))
            assert values == [b"r0", b"r1", b"r2", b"r3"]
            joined(app)
            addresses = {(c.host, c.port) for c in consumer._net._conns.values()}
            assert addresses == {("localhost", px.port)}
            assert px.rewritten >= 2 and px.handshake_failures == []
        finally:
            assert timed_close(consumer) < 5.5


@pytest.mark.parametrize(
    ("which", "extra", "message"),
    [
        pytest.param("other", {}, "unable to get local issuer certificate", id="wrong-CA"),
        pytest.param("wrong-host", {}, "Hostname mismatch", id="wrong-hostname"),
    ],
)
def test_tls_verification_failures_are_raised_from_poll(
    kafka: EmbeddedKafka,
    certs: dict[str, Certificates],
    which: str,
    extra: dict[str, Any],
    message: str,
) -> None:
    # wrong CA: the good certificate, trusting another CA; wrong hostname: a certificate for
    # broker.example.com (trusted) served to a client that connects to localhost
    served = certs["wrong-host"] if which == "wrong-host" else certs["good"]
    trusted = certs["wrong-host"].ca if which == "wrong-host" else certs["other"].ca
    with proxy(kafka, served) as px:
        member = GroupMember(config(f"localhost:{px.port}", f"sec-{which}", **tls(trusted)))
        app = App(member)
        try:
            member.subscribe(["sec"])
            app.poll_until(lambda: app.errors, timeout=20, what="poll() raising the TLS failure")
            error = app.errors[0].args[0]
            assert error.code() == KafkaError._SSL
            assert "certificate verification failed" in error.str() and message in error.str()
            assert member.state is not MemberState.STABLE and member.assignment() == []
        finally:
            assert timed_close(member) < 5.5


def test_hostname_check_can_be_turned_off(
    kafka: EmbeddedKafka, certs: dict[str, Certificates]
) -> None:
    """``ssl.endpoint.identification.algorithm=none``: the chain is still verified, the name
    is not."""
    with proxy(kafka, certs["wrong-host"]) as px:
        extra = tls(certs["wrong-host"].ca)
        extra["ssl.endpoint.identification.algorithm"] = "none"
        member = GroupMember(config(f"localhost:{px.port}", "sec-nohost", **extra))
        app = App(member)
        try:
            member.subscribe(["sec"])
            joined(app)
            assert app.errors == []
        finally:
            assert timed_close(member) < 5.5


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_over_tls_end_to_end(
    kafka: EmbeddedKafka, certs: dict[str, Certificates], mechanism: str
) -> None:
    with proxy(kafka, certs["good"], sasl=True) as px:
        member = GroupMember(
            config(f"localhost:{px.port}", f"sec-{mechanism}", **sasl(certs["good"].ca, mechanism))
        )
        spy = HeartbeatSpy(member)
        app, cb = App(member), Callbacks()
        try:
            cb.subscribe(member, ["sec"])
            joined(app)
            app.poll_until(lambda: spy.answered_after(0) >= 3, what="heartbeats through TLS+SASL")
            assert px.authenticated and {m for m, _ in px.authenticated} == {mechanism}
            assert {u for _, u in px.authenticated} == {USER} and px.auth_failures == []
            assert app.errors == []
        finally:
            assert timed_close(member) < 5.5


def test_sasl_data_plane_goes_through_the_proxy_too(
    kafka: EmbeddedKafka, certs: dict[str, Certificates]
) -> None:
    """The fetcher (librdkafka) gets the same security settings and authenticates too."""
    with proxy(kafka, certs["good"], sasl=True) as px:
        consumer = Consumer(
            config(f"localhost:{px.port}", "sec-data", **sasl(certs["good"].ca, "SCRAM-SHA-512"))
        )
        app = App(consumer)
        try:
            consumer.subscribe(["sec"])
            assert sorted(app.next_record().value() for _ in range(4))[0] == b"r0"
            assert len(px.authenticated) >= 2, "the SDK's and the fetcher's connections"
        finally:
            assert timed_close(consumer) < 5.5


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_wrong_password_is_rejected_with_a_clear_error(
    kafka: EmbeddedKafka,
    certs: dict[str, Certificates],
    mechanism: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    with proxy(kafka, certs["good"], sasl=True) as px:
        member = GroupMember(
            config(
                f"localhost:{px.port}",
                f"sec-bad-{mechanism}",
                **sasl(certs["good"].ca, mechanism, WRONG),
            )
        )
        app = App(member)
        try:
            member.subscribe(["sec"])
            app.poll_until(lambda: app.errors, timeout=20, what="poll() raising the auth failure")
            error = app.errors[0].args[0]
            assert error.code() == KafkaError.SASL_AUTHENTICATION_FAILED
            assert f"SASL {mechanism} authentication as '{USER}' failed" in error.str()
            assert member.state is not MemberState.STABLE
            assert px.auth_failures and px.authenticated == []
        finally:
            assert timed_close(member) < 5.5
    text = caplog.text + "".join(str(e) + repr(e) for e in app.errors)
    assert WRONG not in text


def test_credentials_never_appear_in_repr_logs_metrics_or_exceptions(
    kafka: EmbeddedKafka,
    certs: dict[str, Certificates],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, every level
    seen: list[str] = []
    with proxy(kafka, certs["good"], sasl=True) as px:
        for password, group in ((PASSWORD, "sec-leak-ok"), (WRONG, "sec-leak-bad")):
            settings = sasl(certs["good"].ca, "SCRAM-SHA-256", password)
            settings["ssl_key_password"] = "key-Pa55word-" + password
            errors: list[KafkaError] = []
            conf = config(f"localhost:{px.port}", group, **settings)
            consumer = Consumer({**conf, "error_cb": errors.append})
            app = App(consumer)
            try:
                consumer.subscribe(["sec"])
                if password == PASSWORD:
                    joined(app)
                else:
                    app.poll_until(lambda e=errors: e, timeout=20, what="the auth failure")
                seen += [
                    repr(consumer),
                    str(consumer),
                    repr(consumer._config),
                    repr(consumer._config.connection),
                    repr(consumer._net),
                    repr(consumer.metrics()),
                    repr(consumer.assignment()),
                ]
                seen += [str(e) + repr(e) + e.args[0].str() for e in app.errors]
                seen += [repr(e) + e.str() for e in errors]
            finally:
                assert timed_close(consumer) < 5.5
        assert px.authenticated and px.auth_failures
    out, err = capfd.readouterr()
    text = "\n".join([*seen, caplog.text, out, err])
    assert "SASL SCRAM-SHA-256 authentication" in text, "the failure was logged and raised"
    for secret in (PASSWORD, WRONG, "key-Pa55word-"):
        assert secret not in text, f"{secret!r} leaked"


def test_set_sasl_credentials_applies_to_the_next_authentication(
    kafka: EmbeddedKafka, certs: dict[str, Certificates]
) -> None:
    """Started with a wrong password, the consumer fails to authenticate; after
    set_sasl_credentials() both its group connections and its fetcher's get in."""
    errors: list[KafkaError] = []
    with proxy(kafka, certs["good"], sasl=True) as px:
        consumer = Consumer(
            {
                **config(
                    f"localhost:{px.port}",
                    "sec-set-creds",
                    **sasl(certs["good"].ca, "SCRAM-SHA-256", WRONG),
                ),
                "error_cb": errors.append,
            }
        )
        app = App(consumer)
        try:
            consumer.subscribe(["sec"])
            # As confluent-kafka: an authentication failure goes to error_cb, not poll().
            app.poll_until(lambda: errors, timeout=20, what="the authentication failure")
            assert errors[0].code() == KafkaError._AUTHENTICATION and app.errors == []
            assert px.authenticated == []
            consumer.set_sasl_credentials(USER, PASSWORD)
            values = sorted(app.next_record(timeout=30).value() for _ in range(4))
            assert values == [b"r0", b"r1", b"r2", b"r3"]
            assert len(px.authenticated) >= 2, "the SDK's and the fetcher's connections"
            with pytest.raises(TypeError):
                consumer.set_sasl_credentials(USER, None)  # type: ignore[arg-type]
        finally:
            assert timed_close(consumer) < 5.5


def test_ca_pem_string_on_both_connections(
    kafka: EmbeddedKafka, certs: dict[str, Certificates]
) -> None:
    """``ssl.ca.pem`` (the CA as a string) is honoured by the group connection and the
    fetcher alike."""
    with proxy(kafka, certs["good"]) as px:
        settings = {"security_protocol": "SSL", "ssl_ca_pem": certs["good"].ca.read_text()}
        consumer = Consumer(config(f"localhost:{px.port}", "sec-capem", **settings))
        app = App(consumer)
        try:
            consumer.subscribe(["sec"])
            assert sorted(app.next_record().value() for _ in range(4))[0] == b"r0"
            joined(app)
            assert px.handshake_failures == [] and px.connections >= 2
        finally:
            assert timed_close(consumer) < 5.5


def test_group_member_set_sasl_credentials(
    kafka: EmbeddedKafka, certs: dict[str, Certificates]
) -> None:
    with proxy(kafka, certs["good"], sasl=True) as px:
        member = GroupMember(
            config(
                f"localhost:{px.port}",
                "sec-setcreds",
                **sasl(certs["good"].ca, "SCRAM-SHA-256", WRONG),
            )
        )
        app = App(member)
        try:
            member.subscribe(["sec"])
            app.poll_until(lambda: app.errors, timeout=20, what="the auth failure")
            assert app.errors[0].args[0].code() == KafkaError.SASL_AUTHENTICATION_FAILED
            with pytest.raises(TypeError, match="a username and a password"):
                member.set_sasl_credentials(USER, None)  # type: ignore[arg-type]
            member.set_sasl_credentials(USER, PASSWORD)
            joined(app)
            assert (("SCRAM-SHA-256", USER) in px.authenticated) and px.auth_failures
            assert PASSWORD not in repr(member._net._settings.credentials)
        finally:
            assert timed_close(member) < 5.5


def test_logger_receives_the_sdk_and_fetcher_records(
    kafka: EmbeddedKafka, certs: dict[str, Certificates], caplog: pytest.LogCaptureFixture
) -> None:
    """``logger`` takes a ``logging.Logger``: the consumer's own records (here the failed
    authentication) go to it instead of ``consumer_sdk.*``, and so do librdkafka's."""
    caplog.set_level(logging.DEBUG)
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    app_logger = logging.getLogger("app.kafka.sec-logger")
    app_logger.setLevel(logging.DEBUG)
    app_logger.propagate = False
    app_logger.addHandler(Keep())
    with proxy(kafka, certs["good"], sasl=True) as px:
        settings = sasl(certs["good"].ca, "PLAIN", WRONG)
        consumer = Consumer(
            config(f"localhost:{px.port}", "sec-logger", logger=app_logger, **settings)
        )
        app = App(consumer)
        try:
            consumer.subscribe(["sec"])
            app.poll_until(
                lambda: any(
                    r.name.startswith("consumer_sdk") and "SASL PLAIN" in r.getMessage()
                    for r in records
                ),
                timeout=20,
                what="the SDK's record in the application logger",
            )
            # librdkafka's lines reach the logger when the fetcher is polled
            app.poll_until(
                lambda: any(not r.name.startswith("consumer_sdk") for r in records),
                timeout=30,
                what="a librdkafka record from the fetcher",
            )
        finally:
            assert timed_close(consumer) < 5.5
    routed = [
        r
        for r in caplog.records
        if "SASL PLAIN authentication" in r.getMessage() and r.name.startswith("consumer_sdk")
    ]
    assert routed == [], "records of the consumer's thread went to consumer_sdk.* too"


def test_a_bad_fetcher_value_is_a_config_error_not_an_attribute_error(
    kafka: EmbeddedKafka,
) -> None:
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(ConfigError, match=r"isolation\.level: invalid value 'serializable'"):
        Consumer(config(kafka, "sec-badkey", isolation_level="serializable"))
    leftover = {t.name for t in threading.enumerate()} - before
    assert not any(name.startswith("consumer-sdk-") for name in leftover), leftover
