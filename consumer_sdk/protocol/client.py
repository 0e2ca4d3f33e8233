"""Cluster client: bootstrap, Metadata with topic ids, FindCoordinator, routing, reconnect.

Blocking and thread-safe (one lock per connection, one for the routing tables). Used by the CLI,
the chaos driver, test clusters and tests; group members use the shared network loop instead.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kio.static.protocol import RequestPayload, ResponsePayload
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_before_delay

from consumer_sdk.backoff import Backoff
from consumer_sdk.domain import (
    ClusterMetadata,
    Coordinator,
    HeartbeatRequest,
    HeartbeatResponse,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionResult,
)
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.errors import (
    BrokerResponseError,
    KafkaException,
    KafkaTimeoutError,
    KafkaTransportError,
    ProtocolError,
    UnsupportedBrokerError,
)
from consumer_sdk.protocol import messages as m
from consumer_sdk.protocol.connection import BrokerConnection, TlsHandshakeError
from consumer_sdk.protocol.security import ConnectionSettings, parse_bootstrap_servers

__all__ = ["ClusterClient", "TraceHook"]

log = logging.getLogger("consumer_sdk.protocol")

R = TypeVar("R", bound=ResponsePayload)

#: ``trace(event, info)``: one hook for logs, metrics and tests (connects, failures, routing).
TraceHook = Callable[[str, Mapping[str, Any]], None]

COORDINATOR_ERRORS = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
_RETRIABLE_CONNECT = (KafkaTransportError, KafkaTimeoutError, ProtocolError)


class ClusterClient:
    """Connections to a Kafka cluster, routed by node id, with coordinator discovery."""

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        trace: TraceHook | None = None,
    ) -> None:
        self.bootstrap = parse_bootstrap_servers(config.get("bootstrap.servers"))
        self.settings = ConnectionSettings.from_config(config)
        self._trace = trace
        self._lock = threading.RLock()
        self._connections: dict[int, BrokerConnection] = {}
        self._addresses: dict[int, tuple[str, int]] = {}
        self._coordinators: dict[str, Coordinator] = {}
        self._metadata: ClusterMetadata | None = None
        self._topic_names: dict[uuid.UUID, str] = {}
        self._backoff: dict[int, tuple[int, float]] = {}
        self._rng = random.Random()
        self._closed = False

    def __repr__(self) -> str:
        servers = ",".join(f"{h}:{p}" for h, p in self.bootstrap)
        return f"ClusterClient(bootstrap={servers!r}, client_id={self.settings.client_id!r})"

    # -- tracing ---------------------------------------------------------------------------

    def _emit(self, event: str, **info: Any) -> None:
        if self._trace is not None:
            try:
                self._trace(event, info)
            except Exception:  # a tracing hook must never break the client
                log.exception("trace hook failed for %s", event)

    # -- connections -----------------------------------------------------------------------

    def _backoff_delay(self, failures: int) -> float:
        """Exponential reconnect backoff with +-20% jitter, as librdkafka's reconnect.backoff."""
        s = self.settings
        initial = max(s.reconnect_backoff_ms, 1)
        backoff = Backoff(initial, max(s.reconnect_backoff_max_ms, initial), 0.2, self._rng)
        return backoff.backoff_s(failures - 1)

    def _open_with_backoff(
        self, host: str, port: int, node_id: int, deadline: float
    ) -> BrokerConnection:
        """Connect to one broker, retrying with backoff until ``deadline``.

        The failure count persists per node across calls, so a caller that retries in a
        loop still backs off instead of reconnecting at full speed.
        """
        s = self.settings
        with self._lock:
            failures, next_at = self._backoff.get(node_id, (0, 0.0))
        early = next_at - time.monotonic()
        if early > 0:
            if early > deadline - time.monotonic():
                time.sleep(max(deadline - time.monotonic(), 0))
                raise KafkaTransportError(
                    f"broker {node_id} ({host}:{port}) is in reconnect backoff after "
                    f"{failures} failed attempt(s)"
                )
            time.sleep(early)

        def attempt() -> BrokerConnection:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaTimeoutError(f"no time left to connect to {host}:{port}")
            with self._lock:
                failures = self._backoff.get(node_id, (0, 0.0))[0]
            self._emit(
                "connect.attempt", node_id=node_id, host=host, port=port, attempt=failures + 1
            )
            conn = BrokerConnection(host, port, s, node_id)
            try:
                conn.open(min(remaining, s.connection_setup_timeout_ms / 1000))
            except _RETRIABLE_CONNECT as exc:
                delay = self._backoff_delay(failures + 1)
                with self._lock:
                    self._backoff[node_id] = (failures + 1, time.monotonic() + delay)
                self._emit(
                    "connect.failed",
                    node_id=node_id,
                    host=host,
                    port=port,
                    error=exc.args[0].str(),
                    backoff_s=delay,
                )
                raise
            with self._lock:
                self._backoff.pop(node_id, None)
            self._emit("connect.ok", node_id=node_id, host=host, port=port)
            return conn

        def wait(_: RetryCallState) -> float:
            with self._lock:
                next_at = self._backoff.get(node_id, (0, 0.0))[1]
            return max(0.0, min(next_at - time.monotonic(), deadline - time.monotonic()))

        retrying = Retrying(
            retry=retry_if_exception_type(_RETRIABLE_CONNECT),
            wait=wait,
            stop=stop_before_delay(max(deadline - time.monotonic(), 0.0)),
            reraise=True,
        )
        return retrying(attempt)

    def connection(self, node_id: int, timeout_s: float | None = None) -> BrokerConnection:
        """An open connection to ``node_id``, reconnecting with backoff within ``timeout_s``."""
        self._check_open()
        with self._lock:
            conn = self._connections.get(node_id)
            if conn is not None and conn.is_open:
                return conn
            address = self._addresses.get(node_id)
        if address is None:
            self.metadata(timeout_s=timeout_s)
            with self._lock:
                address = self._addresses.get(node_id)
            if address is None:
                raise KafkaTransportError(f"broker {node_id} is not in the cluster metadata")
        timeout = self._timeout(timeout_s)
        conn = self._open_with_backoff(*address, node_id, time.monotonic() + timeout)
        with self._lock:
            old = self._connections.get(node_id)
            if old is not None and old is not conn:
                old.close()
            self._connections[node_id] = conn
        return conn

    def _bootstrap_connection(self, deadline: float) -> BrokerConnection:
        """Any live connection, else the bootstrap servers in turn until ``deadline``."""
        with self._lock:
            for conn in self._connections.values():
                if conn.is_open:
                    return conn
        errors: list[str] = []
        tls_failed = False
        rounds = 0
        while True:
            tls_failures = 0
            for index, (host, port) in enumerate(self.bootstrap):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._emit("connect.attempt", node_id=-1 - index, host=host, port=port, attempt=1)
                conn = BrokerConnection(host, port, self.settings, -1 - index)
                try:
                    conn.open(min(remaining, self.settings.connection_setup_timeout_ms / 1000))
                    self._emit("connect.ok", node_id=-1 - index, host=host, port=port)
                    with self._lock:
                        self._connections[-1 - index] = conn
                    return conn
                except _RETRIABLE_CONNECT as exc:
                    self._emit(
                        "connect.failed", node_id=-1 - index, host=host, port=port, error=str(exc)
                    )
                    errors.append(f"{host}:{port}: {exc.args[0].str()}")
                    tls_failed = isinstance(exc, TlsHandshakeError)
                    tls_failures += tls_failed
            remaining = deadline - time.monotonic()
            if tls_failures == len(self.bootstrap):
                # Every server completed TCP but refused TLS (e.g. certificate verification):
                # a configuration problem to report now, not after the whole timeout.
                raise TlsHandshakeError(
                    f"TLS handshake failed with every bootstrap server; last error: {errors[-1]}"
                )
            if remaining <= 0:
                servers = ", ".join(f"{h}:{p}" for h, p in self.bootstrap)
                last = errors[-1] if errors else "no attempt fit in the timeout"
                # A TLS failure stays recognisable: it is a configuration problem to report.
                raise (TlsHandshakeError if tls_failed else KafkaTransportError)(
                    f"could not connect to any bootstrap server ({servers}) within the timeout; "
                    f"last error: {last}"
                )
            rounds += 1
            time.sleep(min(self._backoff_delay(rounds), remaining))

    def send(
        self,
        node_id: int,
        payload: RequestPayload,
        response_type: type[R],
        timeout_s: float | None = None,
    ) -> R:
        """Send one request to ``node_id`` (connecting if needed) and return its response."""
        deadline = time.monotonic() + self._timeout(timeout_s)
        conn = self.connection(node_id, max(deadline - time.monotonic(), 0.001))
        return conn.request(payload, response_type, max(deadline - time.monotonic(), 0.001))

    def _timeout(self, timeout_s: float | None) -> float:
        return self.settings.socket_timeout_ms / 1000 if timeout_s is None else timeout_s

    def _check_open(self) -> None:
        if self._closed:
            raise KafkaException(
                BrokerResponseError.from_code(-172, "the cluster client is closed").args[0]
            )

    # -- metadata --------------------------------------------------------------------------

    def metadata(
        self, topics: list[str] | None = None, timeout_s: float | None = None
    ) -> ClusterMetadata:
        """Fetch Metadata (all topics when ``topics`` is None) and refresh routing and topic ids."""
        self._check_open()
        deadline = time.monotonic() + self._timeout(timeout_s)
        last_error: KafkaException | None = None
        while time.monotonic() < deadline:
            conn = self._bootstrap_connection(deadline)
            version = conn.version_for(m.API_METADATA, m.SUPPORTED_VERSIONS[m.API_METADATA])
            if version is None:
                raise UnsupportedBrokerError(
                    f"broker {conn.host}:{conn.port} lacks Metadata v10+ (topic ids): "
                    "the KIP-848 consumer needs Apache Kafka 4.0 or later"
                )
            payload, response_type = m.metadata_call(topics, version)
            try:
                response = conn.request(
                    payload, response_type, max(deadline - time.monotonic(), 0.001)
                )
            except (KafkaTransportError, KafkaTimeoutError, ProtocolError) as exc:
                last_error = exc
                continue
            md = m.metadata_from_kio(response)
            self._absorb_metadata(md, full=topics is None)
            return md
        raise last_error or KafkaTimeoutError("Metadata request timed out")

    def _absorb_metadata(self, md: ClusterMetadata, full: bool) -> None:
        with self._lock:
            for b in md.brokers:
                if self._addresses.get(b.node_id) != (b.host, b.port):
                    stale = self._connections.pop(b.node_id, None)
                    if stale is not None:
                        stale.close()
                self._addresses[b.node_id] = (b.host, b.port)
            for t in md.topics:
                if t.error_code == 0 and t.topic_id.int != 0:
                    self._topic_names[t.topic_id] = t.name
            if full or self._metadata is None:
                self._metadata = md
            else:
                merged = {t.name: t for t in self._metadata.topics}
                merged.update({t.name: t for t in md.topics})
                self._metadata = ClusterMetadata(
                    md.brokers, tuple(merged.values()), md.controller_id, md.cluster_id
                )

    @property
    def cluster(self) -> ClusterMetadata | None:
        """The latest metadata seen (merged across partial requests)."""
        return self._metadata

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        with self._lock:
            return self._topic_names.get(topic_id)

    def topic_names(self) -> dict[uuid.UUID, str]:
        """Every topic id -> name this client has seen."""
        with self._lock:
            return dict(self._topic_names)

    def topic_id(self, name: str) -> uuid.UUID | None:
        md = self._metadata
        return md.topic_id(name) if md is not None else None

    # -- coordinator -----------------------------------------------------------------------

    def find_coordinator(self, group_id: str, timeout_s: float | None = None) -> Coordinator:
        """FindCoordinator (key type GROUP): v4+ batched form when offered, else v3."""
        self._check_open()
        deadline = time.monotonic() + self._timeout(timeout_s)
        conn = self._bootstrap_connection(deadline)
        versions = m.SUPPORTED_VERSIONS[m.API_FIND_COORDINATOR]
        version = conn.version_for(m.API_FIND_COORDINATOR, versions)
        if version is None:
            raise UnsupportedBrokerError(
                f"broker {conn.host}:{conn.port} lacks FindCoordinator v3+ (needs Kafka 2.4+)"
            )
        payload, response_type = m.find_coordinator_call(group_id, version)
        response = conn.request(payload, response_type, max(deadline - time.monotonic(), 0.001))
        coordinator = m.find_coordinator_from_kio(group_id, response)
        if coordinator.error_code != 0:
            raise BrokerResponseError.from_code(
                coordinator.error_code,
                f"FindCoordinator for group {group_id!r}: {coordinator.error_message or ''}".rstrip(
                    ": "
                ),
            )
        with self._lock:
            address = (coordinator.host, coordinator.port)
            if self._addresses.get(coordinator.node_id) != address:
                stale = self._connections.pop(coordinator.node_id, None)
                if stale is not None:
                    stale.close()
            self._addresses[coordinator.node_id] = address
            self._coordinators[group_id] = coordinator
        self._emit(
            "coordinator.found", group_id=group_id, node_id=coordinator.node_id, version=version
        )
        return coordinator

    def coordinator(self, group_id: str) -> Coordinator | None:
        """The known coordinator of ``group_id``, or None while unknown."""
        with self._lock:
            return self._coordinators.get(group_id)

    def mark_coordinator_unknown(self, group_id: str, reason: str) -> None:
        with self._lock:
            known = self._coordinators.pop(group_id, None)
        if known is not None:
            log.info("group %s: coordinator %s marked unknown: %s", group_id, known.node_id, reason)
            self._emit(
                "coordinator.unknown", group_id=group_id, node_id=known.node_id, reason=reason
            )

    def _coordinator_request(
        self, group_id: str, api_key: int, build: Callable[[int], m.Call], timeout_s: float | None
    ) -> tuple[Any, int]:
        deadline = time.monotonic() + self._timeout(timeout_s)
        coordinator = self.coordinator(group_id) or self.find_coordinator(group_id, timeout_s)
        try:
            conn = self.connection(coordinator.node_id, max(deadline - time.monotonic(), 0.001))
            version = conn.version_for(api_key, m.SUPPORTED_VERSIONS[api_key])
            if version is None:
                raise UnsupportedBrokerError(self._unsupported_message(conn, api_key))
            payload, response_type = build(version)
            return conn.request(
                payload, response_type, max(deadline - time.monotonic(), 0.001)
            ), version
        except (KafkaTransportError, KafkaTimeoutError, ProtocolError) as exc:
            self.mark_coordinator_unknown(group_id, f"{type(exc).__name__}: {exc.args[0].str()}")
            raise

    @staticmethod
    def _unsupported_message(conn: BrokerConnection, api_key: int) -> str:
        where = f"broker {conn.host}:{conn.port} (node {conn.node_id})"
        if api_key == m.API_CONSUMER_GROUP_HEARTBEAT:
            return (
                f"{where} does not support ConsumerGroupHeartbeat (API 68): the KIP-848 consumer "
                "group protocol needs Apache Kafka 4.0+ with group.coordinator.rebalance.protocols "
                "including 'consumer' (or use a classic-protocol client)"
            )
        if api_key == m.API_OFFSET_COMMIT:
            have = conn.api_versions.get(api_key)
            return (
                f"{where} lacks OffsetCommit v9 (member epochs; it offers {have}): "
                "a pre-4.0 broker cannot commit offsets for a KIP-848 group"
            )
        return f"{where} supports no version of {m.api_name(api_key)} that this SDK implements"

    def require_group_protocol(self, group_id: str, timeout_s: float | None = None) -> None:
        """Fail fast with a clear message when the coordinator cannot host a KIP-848 member."""
        coordinator = self.coordinator(group_id) or self.find_coordinator(group_id, timeout_s)
        conn = self.connection(coordinator.node_id, timeout_s)
        for api_key in (m.API_CONSUMER_GROUP_HEARTBEAT, m.API_OFFSET_COMMIT):
            if conn.version_for(api_key, m.SUPPORTED_VERSIONS[api_key]) is None:
                raise UnsupportedBrokerError(self._unsupported_message(conn, api_key))

    # -- group APIs ------------------------------------------------------------------------

    def heartbeat(
        self, request: HeartbeatRequest, timeout_s: float | None = None
    ) -> HeartbeatResponse:
        """Send a ConsumerGroupHeartbeat to the group's coordinator.

        Coordinator errors in the response mark the coordinator unknown; the response is still
        returned so the membership core applies its error policy.
        """
        response, _ = self._coordinator_request(
            request.group_id,
            m.API_CONSUMER_GROUP_HEARTBEAT,
            lambda v: m.heartbeat_call(request, v),
            timeout_s,
        )
        result = m.heartbeat_from_kio(response)
        if result.error_code in COORDINATOR_ERRORS:
            self.mark_coordinator_unknown(request.group_id, ErrorCode.name_of(result.error_code))
        return result

    def offset_commit(
        self, request: OffsetCommitRequest, timeout_s: float | None = None
    ) -> tuple[PartitionResult, ...]:
        response, _ = self._coordinator_request(
            request.group_id,
            m.API_OFFSET_COMMIT,
            lambda v: m.offset_commit_call(request, v),
            timeout_s,
        )
        results = m.offset_commit_from_kio(response)
        if any(r.error_code in COORDINATOR_ERRORS for r in results):
            self.mark_coordinator_unknown(request.group_id, "OffsetCommit coordinator error")
        return results

    def offset_fetch(
        self, request: OffsetFetchRequest, timeout_s: float | None = None
    ) -> OffsetFetchResponse:
        """OffsetFetch; v9 with member id/epoch when offered, else the highest older version."""
        response, _ = self._coordinator_request(
            request.group_id,
            m.API_OFFSET_FETCH,
            lambda v: m.offset_fetch_call(request, v),
            timeout_s,
        )
        result = m.offset_fetch_from_kio(response)
        if result.error_code in COORDINATOR_ERRORS:
            self.mark_coordinator_unknown(request.group_id, "OffsetFetch coordinator error")
        return result

    def describe_group(self, group_id: str, timeout_s: float | None = None) -> dict[str, Any]:
        """ConsumerGroupDescribe for one group (plain dict)."""
        response, _ = self._coordinator_request(
            group_id,
            m.API_CONSUMER_GROUP_DESCRIBE,
            lambda v: m.consumer_group_describe_call([group_id], v),
            timeout_s,
        )
        groups = m.consumer_group_describe_from_kio(response)
        if not groups:
            raise BrokerResponseError.from_code(ErrorCode.GROUP_ID_NOT_FOUND, group_id)
        group = groups[0]
        if group["error_code"] != 0:
            raise BrokerResponseError.from_code(group["error_code"], f"describe {group_id!r}")
        return group

    def list_groups(
        self, types: list[str] | None = None, timeout_s: float | None = None
    ) -> list[dict[str, str]]:
        """ListGroups (v5, with the type filter) from every broker: each lists the groups
        it coordinates. ``types``: e.g. ``["consumer"]`` for KIP-848 groups; None: all."""
        deadline = time.monotonic() + self._timeout(timeout_s)
        md = self.metadata(None, timeout_s)
        groups: dict[str, dict[str, str]] = {}
        for broker in sorted(md.brokers, key=lambda b: b.node_id):
            conn = self.connection(broker.node_id, max(deadline - time.monotonic(), 0.001))
            version = conn.version_for(m.API_LIST_GROUPS, m.SUPPORTED_VERSIONS[m.API_LIST_GROUPS])
            if version is None:
                raise UnsupportedBrokerError(self._unsupported_message(conn, m.API_LIST_GROUPS))
            payload, response_type = m.list_groups_call(list(types or ()), version)
            response = conn.request(payload, response_type, max(deadline - time.monotonic(), 0.001))
            error, listed = m.list_groups_from_kio(response)
            if error != 0:
                raise BrokerResponseError.from_code(error, f"ListGroups on node {broker.node_id}")
            for group in listed:
                groups[group["group_id"]] = group
        return [groups[g] for g in sorted(groups)]

    def list_offsets(
        self,
        partitions: list[tuple[str, int]],
        timestamp: int = m.LATEST_TIMESTAMP,
        read_committed: bool = False,
        timeout_s: float | None = None,
    ) -> dict[tuple[str, int], int]:
        """ListOffsets from each partition's leader: the latest offset (the high watermark;
        the last stable offset with ``read_committed``) by default. Partitions that failed
        (no leader, unknown) are left out."""
        if not partitions:
            return {}
        deadline = time.monotonic() + self._timeout(timeout_s)
        md = self.metadata(sorted({t for t, _ in partitions}), timeout_s)
        leaders: dict[int, list[tuple[str, int]]] = {}
        for topic, partition in partitions:
            found = md.topic(topic)
            meta = next(
                (p for p in (found.partitions if found else ()) if p.partition == partition), None
            )
            if meta is not None and meta.leader >= 0:
                leaders.setdefault(meta.leader, []).append((topic, partition))
        out: dict[tuple[str, int], int] = {}
        for leader, owned in sorted(leaders.items()):
            conn = self.connection(leader, max(deadline - time.monotonic(), 0.001))
            version = conn.version_for(m.API_LIST_OFFSETS, m.SUPPORTED_VERSIONS[m.API_LIST_OFFSETS])
            if version is None:
                raise UnsupportedBrokerError(self._unsupported_message(conn, m.API_LIST_OFFSETS))
            payload, response_type = m.list_offsets_call(owned, timestamp, read_committed, version)
            response = conn.request(payload, response_type, max(deadline - time.monotonic(), 0.001))
            for key, (error, offset) in m.list_offsets_from_kio(response).items():
                if error == 0 and offset >= 0:
                    out[key] = offset
        return out

    def set_sasl_credentials(self, username: str, password: str) -> None:
        """Use these SASL PLAIN/SCRAM credentials from the next connection on; connections
        already authenticated stay up (as librdkafka's ``rd_kafka_sasl_set_credentials``)."""
        # One holder shared by every connection of this client: new connections and KIP-368
        # re-authentications of open ones both use the new credentials.
        self.settings.credentials.set(username, password)

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self._closed = True
            connections = list(self._connections.values())
            self._connections.clear()
        for conn in connections:
            conn.close()

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
