"""What both real-Kafka backends share: their error, group descriptions and cluster operations.

`KafkaCluster` (JVMs from ``KAFKA_HOME``) and `DockerKafka` (a container) subclass
`ClusterOps`, which implements topic, produce and group operations over the backend's
bootstrap address with confluent-kafka's AdminClient and Producer and this SDK's own
protocol client. Every operation runs on the calling thread and blocks until done or timed
out.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Payload = bytes | bytearray | memoryview | str | None
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# broker defaults of the KIP-848 group timings (the min/max bounds are widened around them)
DEFAULT_HEARTBEAT_MS = 5000
DEFAULT_SESSION_MS = 45000
MAX_HEARTBEAT_MS = 15000
MAX_SESSION_MS = 60000
# the helper's own clients: node stops are expected, their disconnect logs are noise
_QUIET = {"log_level": 2, "log.connection.close": False}


class KafkaClusterError(RuntimeError):
    """A KafkaCluster could not start, or an operation on it failed.

    ``code`` is the Kafka error code when the broker answered with one (e.g. 36
    TOPIC_ALREADY_EXISTS); ``log_tail`` holds the last log lines of a node that failed.
    """

    def __init__(
        self, message: str, *, code: int | None = None, log_tail: Sequence[str] = ()
    ) -> None:
        super().__init__(message)
        self.code = code
        self.log_tail = list(log_tail)


@dataclass(frozen=True)
class GroupMemberDescription:
    """One member as the group coordinator describes it (ConsumerGroupDescribe)."""

    member_id: str
    instance_id: str | None
    rack: str | None
    client_id: str
    client_host: str
    member_epoch: int
    subscribed_topics: tuple[str, ...]
    subscribed_regex: str | None
    #: ``{topic: partitions}`` the member owns / will own (topic names resolved from ids)
    assignment: dict[str, tuple[int, ...]]
    target_assignment: dict[str, tuple[int, ...]]

    @property
    def partitions(self) -> set[tuple[str, int]]:
        """The owned partitions as ``{(topic, partition)}``."""
        return {(t, p) for t, parts in self.assignment.items() for p in parts}


@dataclass(frozen=True)
class GroupDescription:
    """A consumer group as the coordinator describes it (``state`` is e.g. ``"Stable"``)."""

    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    coordinator: int
    members: list[GroupMemberDescription] = field(default_factory=list)

    def member(self, member_id: str) -> GroupMemberDescription | None:
        """The member with ``member_id`` or None."""
        return next((m for m in self.members if m.member_id == member_id), None)


# COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR: retried.
_COORDINATOR_MOVING = frozenset({14, 15, 16})


class ClusterOps:
    """Topic, data and group operations over a bootstrap address (shared by the backends)."""

    _lock: threading.RLock
    _admin: Any
    _producer: Any

    @property
    def bootstrap_servers(self) -> str:
        raise NotImplementedError

    def _check_open(self) -> None:
        raise NotImplementedError

    def _live_bootstrap(self) -> str:
        return self.bootstrap_servers

    def _default_replication(self) -> int:
        return 1

    # -- clients ----------------------------------------------------------------------------

    def admin(self) -> Any:
        """A shared ``confluent_kafka.admin.AdminClient`` for this cluster."""
        self._check_open()
        with self._lock:
            if self._admin is None:
                from confluent_kafka.admin import AdminClient

                self._admin = AdminClient({**_QUIET, "bootstrap.servers": self.bootstrap_servers})
            return self._admin

    def _result(self, future: Any, what: str, timeout: float) -> Any:
        from confluent_kafka import KafkaException

        try:
            return future.result(timeout)
        except KafkaException as exc:
            err = exc.args[0]
            raise KafkaClusterError(f"{what}: {err.str()}", code=err.code()) from exc
        except TimeoutError as exc:  # concurrent.futures.TimeoutError is TimeoutError
            raise KafkaClusterError(f"{what}: no answer within {timeout:.0f}s") from exc

    # -- topics and data --------------------------------------------------------------------

    def create_topic(
        self,
        topic: str,
        partitions: int = 1,
        replication_factor: int | None = None,
        *,
        config: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        """Create ``topic`` and wait until every partition has a leader.

        ``replication_factor`` defaults to ``min(3, nodes)``. Raises KafkaClusterError
        (code 36) if the topic exists.
        """
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        _check_topic(topic)
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        rf = replication_factor if replication_factor is not None else self._default_replication()
        new = NewTopic(topic, partitions, rf, config=dict(config or {}))
        [future] = self.admin().create_topics([new], operation_timeout=timeout).values()
        self._result(future, f"create topic {topic!r}", timeout)
        self._await_partitions(topic, partitions, timeout)

    def _await_partitions(self, topic: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(Exception):
                md = self.admin().list_topics(topic, timeout=5).topics.get(topic)
                if (
                    md is not None
                    and md.error is None
                    and len(md.partitions) >= count
                    and all(p.leader >= 0 for p in md.partitions.values())
                ):
                    return
            if time.monotonic() >= deadline:
                raise KafkaClusterError(
                    f"topic {topic!r}: {count} partition(s) with leaders not seen within "
                    f"{timeout:.0f}s"
                )
            time.sleep(0.1)

    def delete_topic(self, topic: str, timeout: float = 30.0) -> None:
        """Delete ``topic`` (KafkaClusterError code 3 if unknown) and wait until it is gone."""
        _check_topic(topic)
        [future] = self.admin().delete_topics([topic], operation_timeout=timeout).values()
        self._result(future, f"delete topic {topic!r}", timeout)
        deadline = time.monotonic() + timeout
        while topic in self.topics():
            if time.monotonic() >= deadline:
                raise KafkaClusterError(f"topic {topic!r} still listed {timeout:.0f}s after delete")
            time.sleep(0.1)

    def add_partitions(self, topic: str, total: int, timeout: float = 30.0) -> None:
        """Grow ``topic`` to ``total`` partitions (CreatePartitions) and wait for leaders."""
        from confluent_kafka.admin import NewPartitions  # type: ignore[attr-defined]

        _check_topic(topic)
        [future] = (
            self.admin()
            .create_partitions([NewPartitions(topic, total)], operation_timeout=timeout)
            .values()
        )
        self._result(future, f"grow topic {topic!r} to {total} partitions", timeout)
        self._await_partitions(topic, total, timeout)

    def topics(self) -> dict[str, int]:
        """``{topic: partition_count}`` of the non-internal topics."""
        try:
            md = self.admin().list_topics(timeout=10)
        except Exception as exc:
            raise KafkaClusterError(f"list topics: {exc}") from exc
        return {
            name: len(t.partitions)
            for name, t in md.topics.items()
            if not name.startswith("__") and t.error is None
        }

    def produce(
        self,
        topic: str,
        values: Iterable[Payload | tuple[Payload, Payload]] | bytes | bytearray | str,
        key: Payload = None,
        partition: int | None = None,
        *,
        headers: Mapping[str, Payload] | Sequence[tuple[str, Payload]] | None = None,
        timeout: float = 30.0,
    ) -> int:
        """Produce ``values`` (acks=all) and return the count delivered.

        Same shape as `EmbeddedKafka.produce`: bytes, str (UTF-8) or None values, or
        ``(key, value)`` tuples overriding ``key``; a lone bytes/str is one message. Raises
        KafkaClusterError if any message is not delivered within ``timeout``.
        """
        _check_topic(topic)
        if isinstance(values, bytes | bytearray | memoryview | str):
            values = [values]
        header_items = headers.items() if isinstance(headers, Mapping) else (headers or ())
        hdrs = [(str(n), _bytes(v)) for n, v in header_items] or None
        from confluent_kafka import KafkaError, KafkaException

        producer = self._get_producer()
        deadline = time.monotonic() + timeout
        errors: list[str] = []
        delivered = 0

        def on_delivery(err: Any, _msg: Any) -> None:
            nonlocal delivered
            if err is not None:
                errors.append(str(err))
            else:
                delivered += 1

        count = 0
        for item in values:
            if isinstance(item, tuple):
                if len(item) != 2:
                    raise ValueError("a tuple item must be (key, value)")
                k, v = item
            else:
                k, v = key, item
            kwargs: dict[str, Any] = {
                "value": _bytes(v),
                "key": _bytes(k),
                "on_delivery": on_delivery,
            }
            if partition is not None:
                kwargs["partition"] = partition
            if hdrs:
                kwargs["headers"] = hdrs
            while True:
                try:
                    producer.produce(topic, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.1)
                except KafkaException as exc:
                    # a partition added a moment ago: refresh the producer's metadata
                    if exc.args[0].code() != KafkaError._UNKNOWN_PARTITION:
                        raise
                    if time.monotonic() >= deadline:
                        raise KafkaClusterError(
                            f"produce to {topic!r}: partition {partition} unknown after "
                            f"{timeout:.0f}s"
                        ) from exc
                    with contextlib.suppress(KafkaException):
                        producer.list_topics(topic, timeout=2)
                    time.sleep(0.05)
            count += 1
        remaining = producer.flush(timeout)
        if errors or remaining or delivered != count:
            raise KafkaClusterError(
                f"produce to {topic!r}: {delivered}/{count} delivered"
                + (f"; errors: {sorted(set(errors))}" if errors else "")
                + (f"; {remaining} still queued after {timeout:.0f}s" if remaining else "")
            )
        return delivered

    def _get_producer(self) -> Any:
        self._check_open()
        with self._lock:
            if self._producer is None:
                from confluent_kafka import Producer

                self._producer = Producer(
                    {
                        **_QUIET,
                        "bootstrap.servers": self.bootstrap_servers,
                        "acks": "all",
                        "linger.ms": 5,
                    }
                )
            return self._producer

    # -- groups -----------------------------------------------------------------------------

    def coordinator_for(self, group: str, timeout: float = 30.0) -> int:
        """The node id of ``group``'s coordinator (FindCoordinator, retried while loading)."""
        from consumer_sdk.errors import KafkaException as SdkKafkaException
        from consumer_sdk.protocol.client import ClusterClient

        self._check_open()
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        with ClusterClient({"bootstrap.servers": self._live_bootstrap()}) as client:
            while time.monotonic() < deadline:
                try:
                    return int(client.find_coordinator(group, timeout_s=5).node_id)
                except SdkKafkaException as exc:
                    last = exc
                    time.sleep(0.1)
        raise KafkaClusterError(f"no coordinator for group {group!r} within {timeout:.0f}s: {last}")

    def describe_group(self, group: str, timeout: float = 30.0) -> GroupDescription:
        """ConsumerGroupDescribe of a KIP-848 group: state, epochs, members with their
        instance id, rack and assignment (topic names). KafkaClusterError (code 69
        GROUP_ID_NOT_FOUND) for an unknown group."""
        from consumer_sdk.errors import BrokerResponseError
        from consumer_sdk.errors import KafkaException as SdkKafkaException
        from consumer_sdk.protocol.client import ClusterClient

        self._check_open()
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        with ClusterClient({"bootstrap.servers": self._live_bootstrap()}) as client:
            while time.monotonic() < deadline:
                try:
                    raw = client.describe_group(group, timeout_s=5)
                    coordinator = client.coordinator(group)
                    names = dict(client.topic_names())
                    ids = {
                        tid
                        for m in raw["members"]
                        for a in (m["assignment"], m["target_assignment"])
                        for tid in a
                    }
                    if not ids <= names.keys():
                        client.metadata(timeout_s=5)
                        names = dict(client.topic_names())
                    break
                except BrokerResponseError as exc:
                    if exc.code == 69:  # GROUP_ID_NOT_FOUND
                        raise KafkaClusterError(f"no group {group!r}", code=69) from exc
                    if not exc.args[0].retriable() and exc.code not in (14, 15, 16):
                        raise KafkaClusterError(
                            f"describe {group!r}: {exc}", code=exc.code
                        ) from exc
                    last = exc
                except SdkKafkaException as exc:
                    last = exc
                time.sleep(0.1)
            else:
                raise KafkaClusterError(
                    f"describe {group!r}: no answer within {timeout:.0f}s: {last}"
                )

        def by_name(assignment: Mapping[uuid.UUID, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
            return {names.get(tid, str(tid)): parts for tid, parts in assignment.items()}

        return GroupDescription(
            group_id=raw["group_id"],
            state=raw["state"],
            group_epoch=raw["group_epoch"],
            assignment_epoch=raw["assignment_epoch"],
            assignor=raw["assignor"],
            coordinator=coordinator.node_id if coordinator is not None else -1,
            members=[
                GroupMemberDescription(
                    member_id=m["member_id"],
                    instance_id=m["instance_id"],
                    rack=m["rack_id"],
                    client_id=m["client_id"],
                    client_host=m["client_host"],
                    member_epoch=m["member_epoch"],
                    subscribed_topics=tuple(m["subscribed_topic_names"]),
                    subscribed_regex=m["subscribed_topic_regex"],
                    assignment=by_name(m["assignment"]),
                    target_assignment=by_name(m["target_assignment"]),
                )
                for m in raw["members"]
            ],
        )

    def committed(self, group: str, timeout: float = 30.0) -> dict[tuple[str, int], int]:
        """``{(topic, partition): offset}`` committed by ``group`` (OffsetFetch for all of the
        group's partitions, through this SDK's protocol client). A coordinator that is moving
        or loading (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS)
        or unreachable is retried until ``timeout``."""
        # Not AdminClient.list_consumer_group_offsets: librdkafka 2.16 crashed the process in
        # it (SIGSEGV) when the group's coordinator moved during the call.
        from consumer_sdk.domain import OffsetFetchRequest
        from consumer_sdk.errors import KafkaException as SdkKafkaException
        from consumer_sdk.protocol.client import ClusterClient

        self._check_open()
        deadline = time.monotonic() + timeout
        last: object = None
        request = OffsetFetchRequest(group, None, require_stable=False)
        with ClusterClient({"bootstrap.servers": self._live_bootstrap()}) as client:
            while time.monotonic() < deadline:
                try:
                    response = client.offset_fetch(request, timeout_s=5)
                except SdkKafkaException as exc:  # transport, timeout, coordinator lookup
                    last = exc
                else:
                    if response.error_code == 0:
                        return {
                            (r.topic, r.partition): r.offset
                            for r in response.partitions
                            if r.error_code == 0 and r.offset >= 0
                        }
                    if response.error_code not in _COORDINATOR_MOVING:
                        raise KafkaClusterError(
                            f"committed offsets of {group!r}: OffsetFetch failed with error "
                            f"{response.error_code}",
                            code=response.error_code,
                        )
                    last = f"error {response.error_code} (coordinator moving or loading)"
                time.sleep(0.1)
        raise KafkaClusterError(
            f"committed offsets of {group!r}: no answer within {timeout:.0f}s: {last}"
        )


def _check_topic(topic: str) -> None:
    if not isinstance(topic, str) or not _TOPIC_RE.match(topic) or topic in (".", ".."):
        raise ValueError(f"invalid topic name {topic!r} (1-249 of [A-Za-z0-9._-])")


def _bytes(value: Payload) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    return bytes(value)
