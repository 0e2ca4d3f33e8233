"""Errors reach the application the way confluent-kafka's ``group.protocol=consumer``
consumer hands them over, checked side by side on a real broker with SASL and ACLs.

Per case, four consumers with the same settings are polled in one loop: confluent-kafka and the
SDK, each with and without ``error_cb``. Each delivery is recorded as (channel, error name):
``message`` (returned by ``poll()`` with ``error()`` set), ``error_cb`` or ``raised``. The
cases: a subscribed topic not authorized, the group not authorized, a topic that does not
exist, no broker at the bootstrap address, a wrong SASL password, and a fatal group error
(an assignor the broker does not have).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from consumer_sdk import Consumer, KafkaError, KafkaException
from consumer_sdk.testing import KafkaCluster, close_client, wait_until

pytestmark = pytest.mark.realkafka

USER, PASSWORD = "alice", "alice-Pa55-word"
GROUP_PREFIX = "ec-ok-"  # alice may read groups with this prefix, and topic ALLOWED
ALLOWED, DENIED = "ec-allowed", "ec-denied"
WAIT_S = 45.0

Seen = set[tuple[str, str]]


@pytest.fixture(scope="module")
def acl_kafka() -> Iterator[KafkaCluster]:
    """One node with a SASL PLAIN listener and the standard authorizer (PLAINTEXT stays the
    super user's, for set-up)."""
    login = "org.apache.kafka.common.security.plain.PlainLoginModule"
    kafka = KafkaCluster(
        1,
        listeners={"SASL": "SASL_PLAINTEXT"},
        server_properties={
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS",
            "listener.name.sasl.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl.plain.sasl.jaas.config": (
                f'{login} required user_{USER}="{PASSWORD}";'
            ),
        },
        heartbeat_interval_ms=500,
        session_timeout_ms=6000,
    )
    try:
        kafka.create_topic(ALLOWED, partitions=1)
        kafka.create_topic(DENIED, partitions=1)
        kafka.produce(ALLOWED, [b"a"] * 3)
        principal = f"User:{USER}"
        acls = [
            AclBinding(
                ResourceType.GROUP,
                GROUP_PREFIX,
                ResourcePatternType.PREFIXED,
                principal,
                "*",
                AclOperation.READ,
                AclPermissionType.ALLOW,
            ),
            AclBinding(
                ResourceType.TOPIC,
                ALLOWED,
                ResourcePatternType.LITERAL,
                principal,
                "*",
                AclOperation.READ,
                AclPermissionType.ALLOW,
            ),
        ]
        for future in kafka.admin().create_acls(acls).values():
            future.result(30)
        yield kafka
    finally:
        kafka.close()


class Observed:
    """One consumer and what reached its application, by channel."""

    def __init__(self, impl: str, conf: dict[str, Any], topics: list[str], cb: bool) -> None:
        self.name = f"{impl}{'+error_cb' if cb else ''}"
        self.impl = impl
        self.seen: Seen = set()
        self.records = 0
        self.stopped = False
        conf = dict(conf)
        if cb:
            conf["error_cb"] = lambda e: self.seen.add(("error_cb", e.name()))
        if impl == "ck":
            self.consumer: Any = confluent_kafka.Consumer({**conf, "group.protocol": "consumer"})
        else:
            self.consumer = Consumer(conf)
        self.consumer.subscribe(topics)

    def poll(self) -> None:
        if self.stopped:
            return
        try:
            msg = self.consumer.poll(0.05)
        except KafkaException as exc:
            self.seen.add(("raised", exc.args[0].name()))
            return
        if msg is None:
            return
        error = msg.error()
        if error is None:
            self.records += 1
            return
        self.seen.add(("message", error.name()))
        if error.code() == KafkaError._FATAL:
            self.stopped = True  # both clients are unusable from here on

    def close(self) -> None:
        if self.impl == "ck":
            assert close_client(self.consumer)
        else:
            self.consumer.close()


def _run(
    make: Callable[[str, bool], Observed], done: Callable[[dict[str, Observed]], bool], what: str
) -> dict[str, Observed]:
    clients: dict[str, Observed] = {}
    try:
        for impl in ("ck", "sdk"):
            for cb in (False, True):
                c = make(impl, cb)
                clients[c.name] = c

        def step() -> bool:
            for c in clients.values():
                c.poll()
            return done(clients)

        try:
            wait_until(step, timeout=WAIT_S, interval=0, description=what)
        except AssertionError as exc:
            seen = {name: sorted(c.seen) for name, c in clients.items()}
            raise AssertionError(f"{exc}; seen: {seen}") from None
        return clients
    finally:
        for c in clients.values():
            c.close()


def _conf(kafka: KafkaCluster, *, sasl: bool, group: str, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": kafka.bootstrap_servers,
        "group.id": f"{group}{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
    }
    if sasl:
        conf.update(
            {
                "bootstrap.servers": kafka.bootstrap_for("SASL"),
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": USER,
                "sasl.password": PASSWORD,
            }
        )
    conf.update(extra)
    return conf


def _same_everywhere(clients: dict[str, Observed], expected: Seen) -> None:
    """Every client, with error_cb or without, saw exactly ``expected`` (no raise)."""
    seen = {name: sorted(c.seen) for name, c in clients.items()}
    assert seen == dict.fromkeys(clients, sorted(expected)), seen


@pytest.mark.parametrize(
    ("case", "topic", "group", "error"),
    [
        ("topic", DENIED, GROUP_PREFIX, "TOPIC_AUTHORIZATION_FAILED"),
        ("group", ALLOWED, "ec-denied-", "GROUP_AUTHORIZATION_FAILED"),
    ],
)
def test_authorization_errors_are_error_events_from_poll(
    acl_kafka: KafkaCluster, case: str, topic: str, group: str, error: str
) -> None:
    """Returned by poll() as an event, whether or not error_cb is set; never raised."""
    expected = {("message", error)}

    def make(impl: str, cb: bool) -> Observed:
        return Observed(impl, _conf(acl_kafka, sasl=True, group=group), [topic], cb)

    clients = _run(
        make,
        lambda cs: all(expected <= c.seen for c in cs.values()),
        f"{error} from every client",
    )
    _same_everywhere(clients, expected)


def test_unknown_topic_is_not_an_error(acl_kafka: KafkaCluster) -> None:
    """A subscribed topic that does not exist (and is not created): no error from either
    client by the time both have read the other topic's records."""
    missing = f"ec-missing-{uuid.uuid4().hex[:8]}"

    def make(impl: str, cb: bool) -> Observed:
        conf = _conf(acl_kafka, sasl=False, group="ec-unknown-")
        return Observed(impl, conf, [ALLOWED, missing], cb)

    clients = _run(
        make,
        lambda cs: all(c.records == 3 for c in cs.values()),
        f"the records of {ALLOWED}",
    )
    _same_everywhere(clients, set())
    assert missing not in acl_kafka.topics()


@pytest.mark.parametrize("case", ["transport", "authentication"])
def test_client_errors_go_to_error_cb_only(acl_kafka: KafkaCluster, case: str) -> None:
    """No broker at the bootstrap address, or a wrong SASL password: error_cb when there is
    one, else nothing reaches the application (confluent-kafka logs them); never raised."""
    if case == "transport":
        extra = {"bootstrap.servers": "127.0.0.1:1"}  # nothing listens on port 1
        expected = {("error_cb", "_TRANSPORT"), ("error_cb", "_ALL_BROKERS_DOWN")}
    else:
        extra = {"sasl.password": "wrong-Pa55-word"}
        expected = {("error_cb", "_AUTHENTICATION"), ("error_cb", "_ALL_BROKERS_DOWN")}

    def make(impl: str, cb: bool) -> Observed:
        conf = _conf(acl_kafka, sasl=True, group=GROUP_PREFIX, **extra)
        return Observed(impl, conf, [ALLOWED], cb)

    clients = _run(
        make,
        lambda cs: all(expected <= c.seen for c in cs.values() if c.name.endswith("error_cb")),
        f"{sorted(expected)} to every error_cb",
    )
    assert {name: sorted(c.seen) for name, c in clients.items()} == {
        "ck": [],
        "ck+error_cb": sorted(expected),
        "sdk": [],
        "sdk+error_cb": sorted(expected),
    }


def test_fatal_group_error_is_a_fatal_event_then_raised(acl_kafka: KafkaCluster) -> None:
    """UNSUPPORTED_ASSIGNOR (fatal): poll() returns a _FATAL event (error_cb is not called,
    as in confluent-kafka); the SDK then raises the fatal error from later calls."""
    expected = {("message", "_FATAL")}

    def make(impl: str, cb: bool) -> Observed:
        conf = _conf(acl_kafka, sasl=False, group="ec-fatal-", **{"group.remote.assignor": "nope"})
        return Observed(impl, conf, [ALLOWED], cb)

    clients = _run(
        make, lambda cs: all(c.stopped for c in cs.values()), "a _FATAL event from every client"
    )
    _same_everywhere(clients, expected)


def test_after_a_fatal_event_the_sdk_raises_the_cause(acl_kafka: KafkaCluster) -> None:
    conf = _conf(acl_kafka, sasl=False, group="ec-fatal-", **{"group.remote.assignor": "nope"})
    consumer = Consumer(conf)
    try:
        consumer.subscribe([ALLOWED])
        events: list[KafkaError] = []

        def fatal_event() -> bool:
            msg = consumer.poll(0.05)
            if msg is not None and msg.error() is not None:
                events.append(msg.error())
            return bool(events)

        wait_until(fatal_event, timeout=WAIT_S, interval=0, description="the _FATAL event")
        assert events[0].code() == KafkaError._FATAL
        assert "UNSUPPORTED_ASSIGNOR" in events[0].str()
        with pytest.raises(KafkaException) as raised:
            consumer.poll(0.05)
        assert raised.value.args[0].fatal()
        assert raised.value.args[0].code() == KafkaError.UNSUPPORTED_ASSIGNOR
    finally:
        consumer.close()
