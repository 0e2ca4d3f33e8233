"""Bad input: configuration errors, malformed broker responses on live connections, callbacks
that block or raise KeyboardInterrupt, signals inside poll(), and closed consumers. Every case
asserts the message a user sees (an exception's text, or the log line when the SDK recovers
by itself)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from consumer_sdk import Consumer, GroupMember, KafkaException, MemberState, TopicPartition
from consumer_sdk.errors import ConfigError
from consumer_sdk.testing import EmbeddedKafka
from consumer_sdk.testing.faulty_proxy import FaultyProxy
from consumer_sdk.testing.tls_proxy import TlsProxy
from tests.reliability.support import (
    HB,
    OFFSET_COMMIT,
    App,
    Callbacks,
    HeartbeatSpy,
    config,
    timed_close,
)

# -- configuration ------------------------------------------------------------------------------

BASE = {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"bootstrap.servers": None}, "bootstrap.servers: required"),
        ({"bootstrap.servers": "nohost"}, "bootstrap.servers: 'nohost' is not host:port"),
        ({"group.id": None}, "group.id: required"),
        ({"group.id": "  "}, "group.id: must be a non-empty string"),
        ({"group.instance.id": ""}, "group.instance.id: must be a non-empty string when set"),
        ({"group.protocol": "classic"}, "group.protocol: expected 'consumer'"),
        ({"group.remote.assignor": "my assignor!"}, "group.remote.assignor: 'my assignor!' is"),
        ({"max.poll.interval.ms": 0}, "max.poll.interval.ms: Input should be greater than"),
        ({"auto.commit.interval.ms": -5}, "auto.commit.interval.ms: Input should be greater"),
        ({"retry.backoff.ms": 0}, "retry.backoff.ms: Input should be greater than"),
        ({"retry.backoff.max.ms": 10**9}, "retry.backoff.max.ms: Input should be less than"),
        ({"enable.auto.commit": "maybe"}, "enable.auto.commit: expected true or false (got 'm"),
        ({"enable.auto.commit": 2}, "enable.auto.commit: expected true or false (got 2)"),
        ({"max.poll.interval.ms": True}, "max.poll.interval.ms: expected an integer, not bool"),
        ({"max.poll.interval.ms": 5000.5}, "max.poll.interval.ms: expected an integer, not float"),
        ({"auto.commit.interval.ms": "5s"}, "auto.commit.interval.ms: expected an integer (got"),
        ({"socket.timeout.ms": True}, "socket.timeout.ms: expected an integer, got True"),
        (
            {"isolation.level": "serializable"},
            "isolation.level: invalid value 'serializable': Invalid value \"serializable\"",
        ),
        ({"fetch.min.bytes": "lots"}, "fetch.min.bytes: invalid value 'lots'"),
        ({"fetch.max.bytes": True}, "fetch.max.bytes: invalid value True"),
        ({"logger": print}, "logger: expected a logging.Logger, got builtin_function_or_method"),
        ({"oauth_cb": "token"}, "oauth_cb: expected a callable, got str"),
        (
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"},
            "sasl.mechanism=OAUTHBEARER: no token source; set oauth_cb",
        ),
        (
            {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "OAUTHBEARER",
                "enable.sasl.oauthbearer.unsecure.jwt": True,
                "sasl.oauthbearer.config": "scope=x",
            },
            "sasl.oauthbearer.config: the unsecured JWT needs principal=NAME",
        ),
        (
            {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "OAUTHBEARER",
                "sasl.oauthbearer.method": "oidc",
            },
            "sasl.oauthbearer.token.endpoint.url: required with sasl.oauthbearer.method=oidc",
        ),
        (
            {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "OAUTHBEARER",
                "sasl.oauthbearer.method": "oidc",
                "sasl.oauthbearer.client.id": "c",
                "sasl.oauthbearer.client.secret": "s",
                "sasl.oauthbearer.token.endpoint.url": "idp",
            },
            "sasl.oauthbearer.token.endpoint.url: expected an http(s) URL, got 'idp'",
        ),
        (
            {"security.protocol": "SSL", "ssl.ca.pem": "not a pem"},
            "ssl.ca.pem: cannot load the CA certificate(s)",
        ),
        (
            {"security.protocol": "SSL", "ssl.ca.location": "/nonexistent/ca.pem"},
            "ssl.ca.location: cannot load the CA certificate(s)",
        ),
        (
            {"ssl.ca.location": "/a.pem", "ssl.ca.pem": "x"},
            "ssl.ca.location and ssl.ca.pem: set only one of them",
        ),
        (
            {"security.protocol": "SSL", "ssl.keystore.location": "/nonexistent/ks.p12"},
            "ssl.keystore.location: cannot read '/nonexistent/ks.p12'",
        ),
        ({"group.protocol.type": "consumer"}, "group.protocol.type: not allowed"),
        ({"security.protocol": "TLS"}, "security.protocol: 'TLS' is not one of"),
        ({"security.protocol": "SASL_SSL"}, "sasl.username / sasl.password: required"),
        ({"sasl.mechanism": "GSSAPI"}, "sasl.mechanism: 'GSSAPI' is not supported"),
        ({"socket.timeout.ms": "soon"}, "socket.timeout.ms: expected an integer"),
        ({"receive.message.max.bytes": 10}, "receive.message.max.bytes: expected an integer >="),
        ({"ssl.endpoint.identification.algorithm": "dns"}, "expected https or none"),
        ({"error_cb": "not callable"}, "error_cb: expected a callable, got str"),
        ({"fetch.max.wait.ms": 10}, "fetch.max.wait.ms: unknown configuration property"),
    ],
)
def test_configuration_errors_name_the_key_and_the_reason(
    settings: dict[str, Any], message: str
) -> None:
    conf = {**BASE, **settings}
    conf = {k: v for k, v in conf.items() if v is not None}
    with pytest.raises(ConfigError) as info:
        GroupMember(conf)
    assert message in str(info.value)
    assert info.value.args[0].code() == -186  # _INVALID_ARG


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        (["bootstrap.servers"], "configuration must be a dict, got list"),
        ({**BASE, 7: "x"}, "configuration keys must be strings, got 7"),
    ],
)
def test_configuration_that_is_not_a_mapping_of_strings(conf: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        GroupMember(conf)


def test_secrets_in_a_bad_configuration_are_not_echoed() -> None:
    with pytest.raises(ConfigError) as info:
        GroupMember({**BASE, "sasl.password": "Top-Secret-1", "security.protocol": "SASL_SSL"})
    assert "Top-Secret-1" not in str(info.value) and "sasl.username" in str(info.value)


# -- malformed responses through a fault-injecting proxy ----------------------------------------


@pytest.fixture
def proxied(embedded_kafka_factory: Any) -> Iterator[tuple[EmbeddedKafka, FaultyProxy]]:
    """client -> FaultyProxy -> address-rewriting TlsProxy (plaintext) -> the mock broker, so
    the bootstrap, coordinator and fetcher connections all pass the fault injector."""
    kafka: EmbeddedKafka = embedded_kafka_factory(
        brokers=1, heartbeat_interval_ms=300, session_timeout_ms=6000
    )
    kafka.create_topic("bad", partitions=2, replication_factor=1)
    rewriter = TlsProxy(kafka.broker_address(1))
    faulty = FaultyProxy("127.0.0.1", rewriter.port)
    rewriter.advertise[kafka.broker_address(1)] = ("127.0.0.1", faulty.port)
    try:
        yield kafka, faulty
    finally:
        faulty.close()
        rewriter.close()


FAULT_MESSAGES = {
    "truncate": "truncated frame",
    "garble": "cannot decode ConsumerGroupHeartbeatResponse",
    "wrong_correlation_id": "does not match the awaited request",
    "oversize_length": "exceeds the limit",
    "disconnect": "closed by the broker",
}


@pytest.mark.parametrize("kind", list(FAULT_MESSAGES))
def test_malformed_heartbeat_response_reconnects_and_keeps_the_assignment(
    proxied: tuple[EmbeddedKafka, FaultyProxy], kind: Any, caplog: pytest.LogCaptureFixture
) -> None:
    kafka, faulty = proxied
    caplog.set_level(logging.WARNING, logger="consumer_sdk")
    consumer = Consumer(config(f"127.0.0.1:{faulty.port}", f"bad-{kind}"))
    app, cb = App(consumer), Callbacks()
    spy = HeartbeatSpy(consumer)
    try:
        kafka.produce("bad", [b"before"] * 2)
        cb.subscribe(consumer, ["bad"])
        app.next_record()
        app.poll_until(lambda: consumer.state is MemberState.STABLE, what="stable")
        accepted = faulty.connections_accepted
        faulty.inject(kind, api_key=HB, count=2)  # two in a row: the retry is hit too
        app.poll_until(lambda: faulty.pending_faults() == 0, what="the faults delivered")
        app.poll_until(
            lambda: sum(c.error_code == 0 for c in spy.snapshot()) >= 2, what="heartbeats again"
        )
        assert faulty.connections_accepted > accepted, "the client reconnected"
        failures = [c.failure for c in spy.snapshot() if c.failure]
        assert len(failures) == 2 and all(FAULT_MESSAGES[kind] in f for f in failures), failures
        assert FAULT_MESSAGES[kind] in caplog.text, "the reason is logged"
        assert consumer.state is MemberState.STABLE and len(consumer.assignment()) == 2
        assert cb.kinds() == ["assign"], "a bad frame is not a reason to lose partitions"
        assert app.errors == []
        kafka.produce("bad", [b"after"])
        assert app.next_record().value() == b"after"
    finally:
        assert timed_close(consumer) < 5.5


@pytest.mark.parametrize("kind", ["garble", "truncate", "wrong_correlation_id"])
def test_malformed_commit_response_is_retried(
    proxied: tuple[EmbeddedKafka, FaultyProxy], kind: Any
) -> None:
    _kafka, faulty = proxied
    member = GroupMember(
        config(f"127.0.0.1:{faulty.port}", f"bad-commit-{kind}", enable_auto_commit=False)
    )
    app = App(member)
    try:
        member.subscribe(["bad"])
        app.poll_until(lambda: member.state is MemberState.STABLE and member.assignment())
        faulty.inject(kind, api_key=OFFSET_COMMIT)
        offsets = [TopicPartition("bad", 0, 5)]
        assert member.commit(offsets=offsets, asynchronous=False) == offsets
        assert faulty.injected == [(kind, OFFSET_COMMIT)]
        assert member.committed(offsets)[0].offset == 5
    finally:
        assert timed_close(member) < 5.5


def test_every_connection_goes_through_the_fault_injector(
    proxied: tuple[EmbeddedKafka, FaultyProxy],
) -> None:
    kafka, faulty = proxied
    consumer = Consumer(config(f"127.0.0.1:{faulty.port}", "bad-route"))
    app = App(consumer)
    try:
        kafka.produce("bad", [b"x"])
        consumer.subscribe(["bad"])
        app.next_record()
        addresses = {(c.host, c.port) for c in consumer._net._conns.values()}
        assert addresses == {("127.0.0.1", faulty.port)}
        # the SDK's bootstrap + coordinator connections and the fetcher's
        assert faulty.connections_accepted >= 3
    finally:
        assert timed_close(consumer) < 5.5


# -- callbacks and signals ------------------------------------------------------------------


@pytest.fixture
def kafka1(embedded_kafka_factory: Any) -> EmbeddedKafka:
    kafka: EmbeddedKafka = embedded_kafka_factory(
        brokers=1, heartbeat_interval_ms=300, session_timeout_ms=6000
    )
    kafka.create_topic("cb", partitions=2, replication_factor=1)
    return kafka


def test_callback_blocking_past_the_rebalance_timeout(
    kafka1: EmbeddedKafka, caplog: pytest.LogCaptureFixture
) -> None:
    """on_assign blocks longer than max.poll.interval.ms (the rebalance timeout): the member
    keeps heartbeating meanwhile, then leaves the group as the poll timer expired, says why,
    and rejoins on the next poll()."""
    caplog.set_level(logging.WARNING, logger="consumer_sdk")
    member = GroupMember(config(kafka1, "cb-block", max_poll_interval_ms=1500))
    spy = HeartbeatSpy(member)
    app, cb = App(member), Callbacks()
    cb.assign_hook = lambda parts: time.sleep(2.5)
    try:
        cb.subscribe(member, ["cb"])
        app.poll_until(lambda: cb.kinds()[:1] == ["assign"], what="the blocking callback")
        beats = [c for c in spy.snapshot() if c.sent < cb.events[0][0] + 2.5]
        assert len(beats) >= 3, "heartbeats went on while the callback blocked"
        assert "max.poll.interval.ms" in caplog.text and "Leaving the group" in caplog.text
        app.poll_until(
            lambda: (
                member.state is MemberState.STABLE
                and len(member.assignment()) == 2
                and any(c.epoch == 0 for c in spy.snapshot()[1:])
            ),
            what="rejoined after the poll timer expired",
        )
        assert app.errors == []
    finally:
        assert timed_close(member) < 5.5


def test_keyboard_interrupt_from_a_callback_leaves_the_consumer_usable(
    kafka1: EmbeddedKafka,
) -> None:
    member = GroupMember(config(kafka1, "cb-kbd"))
    calls: list[int] = []

    def on_assign(consumer: Any, parts: list[TopicPartition]) -> None:
        calls.append(len(parts))
        if len(calls) == 1:
            raise KeyboardInterrupt

    try:
        member.subscribe(["cb"], on_assign=on_assign)
        with pytest.raises(KeyboardInterrupt):
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                member.poll(0.1)
        app = App(member)
        app.poll_until(
            lambda: member.state is MemberState.STABLE and len(member.assignment()) == 2,
            what="the assignment retried after the interrupt",
        )
        assert len(calls) >= 2 and app.errors == []
    finally:
        assert timed_close(member) < 5.5


def test_keyboard_interrupt_by_a_signal_inside_poll(kafka1: EmbeddedKafka) -> None:
    """SIGALRM raises KeyboardInterrupt at arbitrary points inside poll(); the consumer stays
    usable each time and still closes in time."""
    kafka1.produce("cb", [f"v{i}".encode() for i in range(200)])
    consumer = Consumer(config(kafka1, "cb-signal", enable_auto_commit=False))

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    interrupts = 0
    records: set[tuple[int, int]] = set()
    try:
        consumer.subscribe(["cb"])
        deadline = time.monotonic() + 20
        while len(records) < 200 and time.monotonic() < deadline:
            signal.setitimer(signal.ITIMER_REAL, 0.013 + 0.007 * (interrupts % 7))
            try:
                while True:
                    msg = consumer.poll(0.05)
                    if msg is not None and msg.error() is None:
                        records.add((msg.partition(), msg.offset()))
            except KeyboardInterrupt:
                interrupts += 1
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        assert interrupts >= 10
        assert len(records) == 200, "every record still arrives"
        assert consumer.state is MemberState.STABLE
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        took = timed_close(consumer)
    assert took < 5.5
    assert threading.active_count() < 50


def test_close_twice_and_using_a_closed_consumer(kafka1: EmbeddedKafka) -> None:
    consumer = Consumer(config(kafka1, "cb-closed"))
    consumer.subscribe(["cb"])
    App(consumer).poll_until(lambda: consumer.state is MemberState.STABLE)
    assert timed_close(consumer) < 5.5
    started = time.monotonic()
    consumer.close()
    assert time.monotonic() - started < 0.1, "the second close() is a no-op"
    tp = [TopicPartition("cb", 0, 1)]
    calls = {
        "poll": lambda: consumer.poll(0),
        "consume": lambda: consumer.consume(1, 0),
        "subscribe": lambda: consumer.subscribe(["cb"]),
        "unsubscribe": consumer.unsubscribe,
        "commit": lambda: consumer.commit(offsets=tp, asynchronous=False),
        "committed": lambda: consumer.committed(tp),
        "position": lambda: consumer.position(tp),
        "pause": lambda: consumer.pause(tp),
        "resume": lambda: consumer.resume(tp),
    }
    for name, call in calls.items():
        with pytest.raises(KafkaException) as info:
            call()
        assert info.value.args[0].str() == "the consumer is closed", name
        assert info.value.args[0].code() == -172, name  # _STATE
    assert consumer.assignment() == [] and "UNSUBSCRIBED" in repr(consumer)
