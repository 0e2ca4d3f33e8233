"""SASL mechanisms (RFC test vectors) and secret handling in settings."""

from __future__ import annotations

import logging

import pytest

from consumer_sdk.errors import ConfigError
from consumer_sdk.protocol.sasl import PlainClient, SaslError, ScramClient
from consumer_sdk.protocol.security import ConnectionSettings, Secret, parse_bootstrap_servers


def test_scram_sha256_rfc7677_vector() -> None:
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", lambda: "rOprNGfwEbeRWgbNEkqO")
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    final = client.step(
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert final == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert client.step(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=") is None


def test_scram_rejects_a_forged_server_signature() -> None:
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", lambda: "rOprNGfwEbeRWgbNEkqO")
    client.first()
    client.step(
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    with pytest.raises(SaslError, match="server signature mismatch") as info:
        client.step(b"v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    assert "pencil" not in str(info.value)


def test_scram_rejects_a_nonce_the_client_did_not_start() -> None:
    client = ScramClient("SCRAM-SHA-512", "user", "pencil", lambda: "abc")
    with pytest.raises(SaslError, match="invalid server nonce"):
        client.step(b"r=zzz,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")


def test_plain_message_layout() -> None:
    assert PlainClient("alice", "s3cret").first() == b"\0alice\0s3cret"


def test_secrets_never_in_repr_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    settings = ConnectionSettings.from_config(
        {
            "bootstrap.servers": "127.0.0.1:9092",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": "hunter2-very-secret",
            "ssl.key.password": "another-secret",
        }
    )
    caplog.set_level(logging.DEBUG)
    logging.getLogger("consumer_sdk").info("settings %r %s", settings, settings.sasl_password)
    text = repr(settings) + str(settings.sasl_password) + caplog.text
    assert "hunter2-very-secret" not in text and "another-secret" not in text
    assert settings.sasl_password == Secret("hunter2-very-secret")
    assert settings.ssl_check_hostname and settings.ssl_verify


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"security.protocol": "SASL_SSL"}, "sasl.username / sasl.password: required"),
        ({"security.protocol": "TLS"}, "security.protocol: 'TLS' is not one of"),
        ({"sasl.mechanism": "GSSAPI"}, "sasl.mechanism: 'GSSAPI' is not supported"),
        ({"socket.timeout.ms": "soon"}, "socket.timeout.ms: expected an integer"),
        ({"enable.ssl.certificate.verification": "maybe"}, "expected true or false"),
        ({"ssl.endpoint.identification.algorithm": "x"}, "expected https or none"),
    ],
)
def test_bad_settings_name_the_key(config: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ConnectionSettings.from_config(config)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "bootstrap.servers: required"),
        ("host", "'host' is not host:port"),
        ("h:99999", "'h:99999' is not host:port"),
    ],
)
def test_bad_bootstrap_servers(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_bootstrap_servers(value)


def test_bootstrap_servers_parse() -> None:
    assert parse_bootstrap_servers("a:1, PLAINTEXT://b:2,[::1]:3") == [
        ("a", 1),
        ("b", 2),
        ("::1", 3),
    ]
