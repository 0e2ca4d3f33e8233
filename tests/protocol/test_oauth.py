"""OAUTHBEARER token sources and the client side of RFC 7628 (no broker needed)."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest

from consumer_sdk.errors import ConfigError
from consumer_sdk.protocol.oauth import (
    OAuthError,
    OAuthToken,
    OAuthTokenProvider,
    jwt_claims,
    oauthbearer_initial_message,
    parse_extensions,
    token_from_callback,
    unsecured_jwt,
)
from consumer_sdk.protocol.sasl import OAuthBearerClient
from consumer_sdk.protocol.security import ConnectionSettings


def _part(text: str) -> dict[str, object]:
    decoded: dict[str, object] = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    return decoded


def test_unsecured_jwt_matches_librdkafkas_default() -> None:
    token = unsecured_jwt(
        "principal=admin scope=read,write lifeSeconds=120 extension_traceId=abc", now_s=1000
    )
    header, payload, signature = token.value.split(".")
    assert _part(header) == {"alg": "none"} and signature == ""
    assert _part(payload) == {"sub": "admin", "iat": 1000, "exp": 1120, "scope": ["read", "write"]}
    assert (token.principal, token.expiry_s, dict(token.extensions)) == (
        "admin",
        1120.0,
        {"traceId": "abc"},
    )
    assert jwt_claims(token.value)["sub"] == "admin"
    custom = unsecured_jwt("principal=bob principalClaimName=user", now_s=0)
    assert jwt_claims(custom.value)["user"] == "bob"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("", "needs principal=NAME"),
        ("principal=a lifeSeconds=0", "lifeSeconds must be a positive integer"),
        ("principal=a colour=blue", "unknown setting(s) colour"),
        ("principal", "'principal' is not key=value"),
        ("principal=a extension_auth=x", "invalid SASL extension name 'auth'"),
    ],
)
def test_unsecured_jwt_config_errors(config: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"sasl\.oauthbearer\.config") as info:
        unsecured_jwt(config)
    assert message in str(info.value)


def test_initial_message_and_server_error_exchange() -> None:
    token = OAuthToken("tok.en.", time.time() + 60, "p", {"a": "1"})
    assert oauthbearer_initial_message(token) == b"n,,\x01auth=Bearer tok.en.\x01a=1\x01\x01"
    client = OAuthBearerClient(oauthbearer_initial_message(token))
    assert client.step(b"") is None  # accepted
    rejected = OAuthBearerClient(b"x")
    assert rejected.step(b'{"status":"invalid_token"}') == b"\x01"  # RFC 7628 3.2.2 ack
    assert rejected.server_error == '{"status":"invalid_token"}'


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ("token", "must return (token, expiry_epoch_seconds"),
        (("t",), "must return (token, expiry_epoch_seconds"),
        (("", 1e12), "non-empty string"),
        (("t", "soon"), "the expiry must be epoch seconds"),
        (("t", True), "the expiry must be epoch seconds"),
        (("t", 1.0), "already expired"),
        (("t", 1e12, 5), "the principal must be a string"),
        (("t", 1e12, "p", {"k": 1}), "dict of str to str"),
        (("t", 1e12, "p", {"auth": "x"}), "invalid SASL extension name"),
    ],
)
def test_oauth_cb_results_are_validated(result: object, message: str) -> None:
    with pytest.raises(OAuthError) as info:
        token_from_callback(result)
    assert message in info.value.args[0].str()


def test_provider_caches_and_renews_at_80_percent_of_the_lifetime() -> None:
    fetched: list[float] = []

    def fetch() -> OAuthToken:
        now = time.time()
        fetched.append(now)
        # a token that is already past 80% of its lifetime when the second call comes
        return OAuthToken("t", now + 0.5, obtained_s=now)

    provider = OAuthTokenProvider(fetch, "test")
    first = provider.token()
    assert provider.token() is first and provider.fetches == 1
    time.sleep(0.45)
    assert provider.token() is not first and provider.fetches == 2
    provider.invalidate()
    provider.token()
    assert provider.fetches == 3


def test_oauth_cb_gets_the_config_string_and_its_errors_are_reported() -> None:
    seen: list[str | None] = []

    def callback(config: str | None) -> tuple[str, float, str, dict[str, str]]:
        seen.append(config)
        return "jwt", time.time() + 60, "svc", {"logicalCluster": "lkc1"}

    token = OAuthTokenProvider.from_callback(callback, "a=b").token()
    assert seen == ["a=b"] and token.principal == "svc"
    assert dict(token.extensions) == {"logicalCluster": "lkc1"}

    def broken(config: str | None) -> tuple[str, float]:
        raise RuntimeError("vault is down")

    with pytest.raises(OAuthError) as info:
        OAuthTokenProvider.from_callback(broken, None).token()
    assert "oauth_cb raised RuntimeError: vault is down" in info.value.args[0].str()


def test_extensions_key_is_parsed_and_checked() -> None:
    assert parse_extensions("a=1, bB=two", "k") == {"a": "1", "bB": "two"}
    with pytest.raises(ConfigError, match="'x' is not key=value"):
        parse_extensions("x", "sasl.oauthbearer.extensions")


def test_oauthbearer_settings_pick_the_token_source_like_librdkafka() -> None:
    base = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER"}
    unsecured = ConnectionSettings.from_config(
        {
            **base,
            "enable.sasl.oauthbearer.unsecure.jwt": "true",
            "sasl.oauthbearer.config": "principal=me",
        }
    )
    assert unsecured.oauth is not None and unsecured.oauth.describe == "unsecured JWT"
    assert unsecured.oauth.token().principal == "me"
    callback = ConnectionSettings.from_config({**base, "oauth_cb": lambda c: ("t", 1e12)})
    assert callback.oauth is not None and callback.oauth.describe == "oauth_cb"
    oidc = ConnectionSettings.from_config(
        {
            **base,
            "sasl.oauthbearer.method": "OIDC",
            "sasl.oauthbearer.client.id": "c",
            "sasl.oauthbearer.client.secret": "s3cret-value",
            "sasl.oauthbearer.token.endpoint.url": "https://idp.example/token",
        }
    )
    assert oidc.oauth is not None and oidc.oauth.describe == "oidc"
    assert "s3cret-value" not in repr(oidc)
    plain = ConnectionSettings.from_config(
        {**base, "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"}
    )
    assert plain.oauth is None


def _self_signed(password: bytes | None) -> tuple[str, str, bytes]:
    """A certificate, its key (PEM, encrypted with ``password``) and a PKCS#12 of both."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import pkcs12
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "client")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    encryption = (
        serialization.BestAvailableEncryption(password)
        if password
        else serialization.NoEncryption()
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    ).decode()
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    p12 = pkcs12.serialize_key_and_certificates(b"client", key, cert, None, encryption)
    return cert_pem, key_pem, p12


def test_pem_strings_and_pkcs12_keystores_load_or_fail_naming_the_key(tmp_path: Any) -> None:
    cert_pem, key_pem, p12 = _self_signed(b"key-Pa55")
    base = {"security.protocol": "SSL", "ssl.certificate.pem": cert_pem, "ssl.key.pem": key_pem}
    ok = ConnectionSettings.from_config({**base, "ssl.key.password": "key-Pa55"})
    assert ok.ssl_context() is ok.ssl_context()  # built once
    assert "BEGIN" not in repr(ok) and "key-Pa55" not in repr(ok)
    with pytest.raises(ConfigError, match=r"ssl\.certificate\.pem / ssl\.key\.pem: the"):
        ConnectionSettings.from_config({**base, "ssl.key.password": "wrong"})
    with pytest.raises(ConfigError, match=r"ssl\.certificate\.pem: not PEM"):
        ConnectionSettings.from_config({**base, "ssl.certificate.pem": "garbage"})
    store = tmp_path / "client.p12"
    store.write_bytes(p12)
    ks = {"security.protocol": "SSL", "ssl.keystore.location": str(store)}
    assert ConnectionSettings.from_config({**ks, "ssl.keystore.password": "key-Pa55"})
    with pytest.raises(ConfigError, match=r"ssl\.keystore\.location: .* this password"):
        ConnectionSettings.from_config({**ks, "ssl.keystore.password": "wrong"})
    with pytest.raises(ConfigError, match="set only one of them"):
        ConnectionSettings.from_config({**ks, "ssl.key.pem": key_pem})


def test_ca_location_takes_a_file_a_directory_or_probe(tmp_path: Any) -> None:
    base = {"security.protocol": "SSL"}
    assert ConnectionSettings.from_config({**base, "ssl.ca.location": "probe"}).ssl_context()
    assert ConnectionSettings.from_config({**base, "ssl.ca.location": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"ssl\.ca\.location: cannot load"):
        ConnectionSettings.from_config({**base, "ssl.ca.location": str(tmp_path / "none.pem")})


def test_oidc_client_credentials_grant_against_a_local_endpoint() -> None:
    """The grant the group connection runs: Basic client authentication, form body, the token's
    exp and principal claim; librdkafka's newer key names; a refused client is a clear error."""
    import http.server
    import threading

    seen: list[tuple[str | None, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            seen.append((self.headers.get("Authorization"), body))
            if self.headers.get("Authorization") != "Basic " + base64.b64encode(b"app:pw").decode():
                self.send_response(401)
                self.end_headers()
                self.wfile.write(b'{"error":"invalid_client"}')
                return
            claims = {"cid": "app-principal", "exp": int(time.time()) + 120}
            jwt = "e30." + base64.urlsafe_b64encode(json.dumps(claims).encode()).decode() + ".c2ln"
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps({"access_token": jwt, "token_type": "bearer"}).encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.client.credentials.client.id": "app",
            "sasl.oauthbearer.client.credentials.client.secret": "pw",
            "sasl.oauthbearer.token.endpoint.url": f"http://127.0.0.1:{server.server_port}/t",
            "sasl.oauthbearer.scope": "kafka",
            "sasl.oauthbearer.sub.claim.name": "cid",
            "sasl.oauthbearer.extensions": "logicalCluster=lkc-1",
        }
        provider = ConnectionSettings.from_config(config).oauth
        assert provider is not None
        token = provider.token()
        assert token.principal == "app-principal" and token.expiry_s > time.time() + 100
        assert dict(token.extensions) == {"logicalCluster": "lkc-1"}
        assert seen[0][1] == "grant_type=client_credentials&scope=kafka"
        bad = ConnectionSettings.from_config(
            {**config, "sasl.oauthbearer.client.credentials.client.secret": "nope"}
        ).oauth
        assert bad is not None
        with pytest.raises(OAuthError) as info:
            bad.token()
        assert 'answered HTTP 401: {"error":"invalid_client"}' in info.value.args[0].str()
    finally:
        server.shutdown()
        server.server_close()
