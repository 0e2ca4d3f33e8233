"""Conversions between the SDK's domain types and ``kio`` entities, per API version.

This is the only module (with ``connection`` and ``framing``) that knows ``kio``.
Each ``*_call`` returns the kio request and the response type to decode; each
``*_from_kio`` turns the decoded response into a domain type.
"""

from __future__ import annotations

import datetime
import uuid
from collections import defaultdict
from collections.abc import Iterator, Mapping
from importlib import import_module
from types import ModuleType
from typing import Any

from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta, i64
from kio.static.protocol import RequestPayload, ResponsePayload

from consumer_sdk.domain import (
    ZERO_UUID,
    Broker,
    ClusterMetadata,
    Coordinator,
    HeartbeatRequest,
    HeartbeatResponse,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionMetadata,
    PartitionResult,
    TopicIdPartitions,
    TopicMetadata,
)

__all__ = [
    "API_CONSUMER_GROUP_DESCRIBE",
    "API_CONSUMER_GROUP_HEARTBEAT",
    "API_DESCRIBE_CONFIGS",
    "API_FIND_COORDINATOR",
    "API_LIST_GROUPS",
    "API_LIST_OFFSETS",
    "API_METADATA",
    "API_NAMES",
    "API_OFFSET_COMMIT",
    "API_OFFSET_FETCH",
    "SUPPORTED_VERSIONS",
    "Schemas",
    "api_name",
]

API_LIST_OFFSETS = 2
API_OFFSET_COMMIT = 8
API_LIST_GROUPS = 16
API_OFFSET_FETCH = 9
API_METADATA = 3
API_FIND_COORDINATOR = 10
API_CONSUMER_GROUP_HEARTBEAT = 68
API_CONSUMER_GROUP_DESCRIBE = 69
API_DESCRIBE_CONFIGS = 32
API_NAMES = {
    API_DESCRIBE_CONFIGS: "DescribeConfigs",
    API_METADATA: "Metadata",
    API_OFFSET_COMMIT: "OffsetCommit",
    API_OFFSET_FETCH: "OffsetFetch",
    API_FIND_COORDINATOR: "FindCoordinator",
    17: "SaslHandshake",
    18: "ApiVersions",
    36: "SaslAuthenticate",
    API_CONSUMER_GROUP_HEARTBEAT: "ConsumerGroupHeartbeat",
    API_CONSUMER_GROUP_DESCRIBE: "ConsumerGroupDescribe",
    API_LIST_GROUPS: "ListGroups",
    API_LIST_OFFSETS: "ListOffsets",
}


def api_name(api_key: int) -> str:
    """``"ConsumerGroupDescribe (API 69)"``: the name users know, and the number brokers log."""
    name = API_NAMES.get(api_key)
    return f"{name} (API {api_key})" if name else f"API {api_key}"


Call = tuple[RequestPayload, type[ResponsePayload]]


class Schemas(Mapping[int, tuple[ModuleType, ModuleType]]):
    """One API's kio request and response modules per version, each imported when first
    used: a client uses one version of each API, and importing every version's modules up
    front cost every process about 0.1 s of CPU at start."""

    def __init__(self, api: str, versions: tuple[int, ...]) -> None:
        self._api = api
        self._versions = versions
        self._loaded: dict[int, tuple[ModuleType, ModuleType]] = {}

    def __getitem__(self, version: int) -> tuple[ModuleType, ModuleType]:
        pair = self._loaded.get(version)
        if pair is None:
            if version not in self._versions:
                raise KeyError(version)
            base = f"kio.schema.{self._api}.v{version}"
            pair = (import_module(f"{base}.request"), import_module(f"{base}.response"))
            self._loaded[version] = pair
        return pair

    def load_newest(self) -> None:
        """Import the newest version's modules: the one a current broker negotiates."""
        self[max(self._versions)]

    def load_all(self) -> None:
        """Import every version's modules, newest first."""
        for version in sorted(self._versions, reverse=True):
            self[version]

    def __iter__(self) -> Iterator[int]:
        return iter(self._versions)

    def __len__(self) -> int:
        return len(self._versions)


_HB = Schemas("consumer_group_heartbeat", (0, 1))
_FC = Schemas("find_coordinator", (3, 4, 5, 6))
_MD = Schemas("metadata", (10, 11, 12))
_OC = Schemas("offset_commit", (9,))
_OF = Schemas("offset_fetch", (6, 7, 8, 9))
_CGD = Schemas("consumer_group_describe", (0, 1))
_LG = Schemas("list_groups", (5,))
_LO = Schemas("list_offsets", (7, 8, 9))
_DC = Schemas("describe_configs", (4,))


_MEMBER_SCHEMAS = (_HB, _FC, _MD, _OF, _OC, _DC)


def warm_member_schemas(every_version: bool) -> None:
    """Import the schemas of the APIs on a group member's join path (heartbeat, coordinator
    lookup, metadata, offsets, the session-timeout lookup): the newest versions, or all."""
    for schemas in _MEMBER_SCHEMAS:
        schemas.load_all() if every_version else schemas.load_newest()


#: Versions this SDK implements, per API key (the highest one the broker also has is used).
SUPPORTED_VERSIONS: dict[int, tuple[int, ...]] = {
    API_CONSUMER_GROUP_HEARTBEAT: tuple(_HB),
    API_FIND_COORDINATOR: tuple(_FC),
    API_METADATA: tuple(_MD),
    API_OFFSET_COMMIT: tuple(_OC),
    API_OFFSET_FETCH: tuple(_OF),
    API_CONSUMER_GROUP_DESCRIBE: tuple(_CGD),
    API_LIST_GROUPS: tuple(_LG),
    API_LIST_OFFSETS: tuple(_LO),
    API_DESCRIBE_CONFIGS: tuple(_DC),
}


# -- ConsumerGroupHeartbeat ----------------------------------------------------------------


def heartbeat_call(req: HeartbeatRequest, version: int) -> Call:
    request_mod, response_mod = _HB[version]
    owned = None
    if req.topic_partitions is not None:
        owned = tuple(
            request_mod.TopicPartitions(
                topic_id=tp.topic_id, partitions=tuple(i32(p) for p in tp.partitions)
            )
            for tp in req.topic_partitions
        )
    fields: dict[str, Any] = dict(
        group_id=req.group_id,
        member_id=req.member_id,
        member_epoch=i32(req.member_epoch),
        instance_id=req.instance_id,
        rack_id=req.rack_id,
        rebalance_timeout=i32Timedelta.parse(
            datetime.timedelta(milliseconds=req.rebalance_timeout_ms)
        ),
        subscribed_topic_names=req.subscribed_topic_names,
        server_assignor=req.server_assignor,
        topic_partitions=owned,
    )
    if version >= 1:
        fields["subscribed_topic_regex"] = req.subscribed_topic_regex
    elif req.subscribed_topic_regex:
        raise ValueError(
            "a regex subscription needs ConsumerGroupHeartbeat v1 (Kafka 4.0+); "
            "the broker only offers v0"
        )
    return request_mod.ConsumerGroupHeartbeatRequest(**fields), (
        response_mod.ConsumerGroupHeartbeatResponse
    )


def _ms(value: datetime.timedelta) -> int:
    return int(value.total_seconds() * 1000)


def heartbeat_from_kio(resp: Any) -> HeartbeatResponse:
    assignment = None
    if resp.assignment is not None:
        assignment = tuple(
            TopicIdPartitions(tp.topic_id or ZERO_UUID, tuple(int(p) for p in tp.partitions))
            for tp in resp.assignment.topic_partitions
        )
    return HeartbeatResponse(
        error_code=int(resp.error_code),
        member_epoch=int(resp.member_epoch),
        heartbeat_interval_ms=_ms(resp.heartbeat_interval),
        member_id=resp.member_id,
        error_message=resp.error_message,
        assignment=assignment,
        throttle_time_ms=_ms(resp.throttle_time),
    )


# -- Metadata ------------------------------------------------------------------------------


def metadata_call(topics: list[str] | None, version: int, allow_auto_create: bool = False) -> Call:
    request_mod, response_mod = _MD[version]
    requested = (
        None
        if topics is None
        else tuple(request_mod.MetadataRequestTopic(topic_id=None, name=t) for t in topics)
    )
    fields: dict[str, Any] = dict(
        topics=requested,
        allow_auto_topic_creation=allow_auto_create,
        include_topic_authorized_operations=False,
    )
    if version <= 10:
        fields["include_cluster_authorized_operations"] = False
    return request_mod.MetadataRequest(**fields), response_mod.MetadataResponse


def metadata_from_kio(resp: Any) -> ClusterMetadata:
    brokers = tuple(Broker(int(b.node_id), b.host, int(b.port), b.rack) for b in resp.brokers)
    topics = tuple(
        TopicMetadata(
            name=t.name or "",
            topic_id=t.topic_id or ZERO_UUID,
            partitions=tuple(
                sorted(
                    (
                        PartitionMetadata(
                            int(p.partition_index), int(p.leader_id), int(p.error_code)
                        )
                        for p in t.partitions
                    ),
                    key=lambda p: p.partition,
                )
            ),
            error_code=int(t.error_code),
        )
        for t in resp.topics
    )
    return ClusterMetadata(brokers, topics, int(resp.controller_id), resp.cluster_id)


# -- FindCoordinator -----------------------------------------------------------------------


def find_coordinator_call(group_id: str, version: int) -> Call:
    request_mod, response_mod = _FC[version]
    if version < 4:
        request = request_mod.FindCoordinatorRequest(key=group_id, key_type=i8(0))
    else:
        request = request_mod.FindCoordinatorRequest(key_type=i8(0), coordinator_keys=(group_id,))
    return request, response_mod.FindCoordinatorResponse


def find_coordinator_from_kio(group_id: str, resp: Any) -> Coordinator:
    if hasattr(resp, "coordinators"):
        for c in resp.coordinators:
            if c.key == group_id:
                return Coordinator(
                    group_id,
                    int(c.node_id),
                    c.host,
                    int(c.port),
                    int(c.error_code),
                    c.error_message,
                )
        return Coordinator(group_id, -1, "", -1, 15, "no coordinator entry for the group")
    return Coordinator(
        group_id,
        int(resp.node_id),
        resp.host,
        int(resp.port),
        int(resp.error_code),
        resp.error_message,
    )


# -- OffsetCommit / OffsetFetch ------------------------------------------------------------


def offset_commit_call(req: OffsetCommitRequest, version: int = 9) -> Call:
    request_mod, response_mod = _OC[9]
    by_topic: dict[str, list[Any]] = defaultdict(list)
    for o in req.offsets:
        by_topic[o.topic].append(
            request_mod.OffsetCommitRequestPartition(
                partition_index=i32(o.partition),
                committed_offset=i64(o.offset),
                committed_leader_epoch=i32(o.leader_epoch),
                committed_metadata=o.metadata,
            )
        )
    request = request_mod.OffsetCommitRequest(
        group_id=GroupId(req.group_id),
        generation_id_or_member_epoch=i32(req.member_epoch),
        member_id=req.member_id,
        group_instance_id=req.instance_id,
        topics=tuple(
            request_mod.OffsetCommitRequestTopic(name=TopicName(t), partitions=tuple(ps))
            for t, ps in sorted(by_topic.items())
        ),
    )
    return request, response_mod.OffsetCommitResponse


def offset_commit_from_kio(resp: Any) -> tuple[PartitionResult, ...]:
    return tuple(
        PartitionResult(t.name, int(p.partition_index), int(p.error_code))
        for t in resp.topics
        for p in t.partitions
    )


def offset_fetch_call(req: OffsetFetchRequest, version: int) -> Call:
    request_mod, response_mod = _OF[version]
    by_topic: dict[str, list[i32]] = defaultdict(list)
    for topic, partition in req.partitions or ():
        by_topic[topic].append(i32(partition))
    if version >= 8:
        topics_v8 = (
            None
            if req.partitions is None
            else tuple(
                request_mod.OffsetFetchRequestTopics(name=t, partition_indexes=tuple(ps))
                for t, ps in sorted(by_topic.items())
            )
        )
        group_fields: dict[str, Any] = dict(group_id=req.group_id, topics=topics_v8)
        if version >= 9:
            group_fields["member_id"] = req.member_id
            group_fields["member_epoch"] = i32(req.member_epoch)
        request = request_mod.OffsetFetchRequest(
            groups=(request_mod.OffsetFetchRequestGroup(**group_fields),),
            require_stable=req.require_stable,
        )
    else:
        topics = (
            None
            if req.partitions is None
            else tuple(
                request_mod.OffsetFetchRequestTopic(name=t, partition_indexes=tuple(ps))
                for t, ps in sorted(by_topic.items())
            )
        )
        fields: dict[str, Any] = dict(group_id=req.group_id, topics=topics)
        if version >= 7:
            fields["require_stable"] = req.require_stable
        request = request_mod.OffsetFetchRequest(**fields)
    return request, response_mod.OffsetFetchResponse


def offset_fetch_from_kio(resp: Any) -> OffsetFetchResponse:
    if hasattr(resp, "groups"):
        if not resp.groups:
            return OffsetFetchResponse(0, ())
        group = resp.groups[0]
        topics, error = group.topics, int(group.error_code)
    else:
        topics, error = resp.topics, int(resp.error_code)
    return OffsetFetchResponse(
        error,
        tuple(
            PartitionResult(
                t.name,
                int(p.partition_index),
                int(p.error_code),
                int(p.committed_offset),
                int(p.committed_leader_epoch),
                p.metadata,
            )
            for t in topics
            for p in t.partitions
        ),
    )


# -- ConsumerGroupDescribe -----------------------------------------------------------------


def consumer_group_describe_call(group_ids: list[str], version: int) -> Call:
    request_mod, response_mod = _CGD[version]
    return (
        request_mod.ConsumerGroupDescribeRequest(
            group_ids=tuple(group_ids), include_authorized_operations=False
        ),
        response_mod.ConsumerGroupDescribeResponse,
    )


def consumer_group_describe_from_kio(resp: Any) -> list[dict[str, Any]]:
    """Plain dicts (the CLI and tests print them); topic ids stay ``uuid.UUID``."""

    def parts(assignment: Any) -> dict[uuid.UUID, tuple[int, ...]]:
        return {
            tp.topic_id or ZERO_UUID: tuple(sorted(int(p) for p in tp.partitions))
            for tp in assignment.topic_partitions
        }

    groups = []
    for g in resp.groups:
        groups.append(
            {
                "group_id": g.group_id,
                "error_code": int(g.error_code),
                "state": g.group_state,
                "group_epoch": int(g.group_epoch),
                "assignment_epoch": int(g.assignment_epoch),
                "assignor": g.assignor_name,
                "members": [
                    {
                        "member_id": m.member_id,
                        "instance_id": m.instance_id,
                        "rack_id": m.rack_id,
                        "member_epoch": int(m.member_epoch),
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "subscribed_topic_names": tuple(m.subscribed_topic_names),
                        "subscribed_topic_regex": m.subscribed_topic_regex,
                        "assignment": parts(m.assignment),
                        "target_assignment": parts(m.target_assignment),
                    }
                    for m in g.members
                ],
            }
        )
    return groups


# -- ListGroups ----------------------------------------------------------------------------


def list_groups_call(types: list[str], version: int) -> Call:
    """ListGroups v5 with a type filter (``consumer``, ``classic``, ``share``; empty: all)."""
    request_mod, response_mod = _LG[version]
    return (
        request_mod.ListGroupsRequest(states_filter=(), types_filter=tuple(types)),
        response_mod.ListGroupsResponse,
    )


def list_groups_from_kio(resp: Any) -> tuple[int, list[dict[str, str]]]:
    """The error code and one plain dict per group (id, state, type, protocol type)."""
    return int(resp.error_code), [
        {
            "group_id": g.group_id,
            "state": g.group_state,
            "type": g.group_type,
            "protocol_type": g.protocol_type,
        }
        for g in resp.groups
    ]


# -- ListOffsets ---------------------------------------------------------------------------

#: ListOffsets timestamps: the offset after the last record / the log start offset.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2


def list_offsets_call(
    partitions: list[tuple[str, int]], timestamp: int, read_committed: bool, version: int
) -> Call:
    request_mod, response_mod = _LO[version]
    by_topic: dict[str, list[int]] = defaultdict(list)
    for topic, partition in partitions:
        by_topic[topic].append(partition)
    return (
        request_mod.ListOffsetsRequest(
            replica_id=i32(-1),
            isolation_level=i8(1 if read_committed else 0),
            topics=tuple(
                request_mod.ListOffsetsTopic(
                    name=TopicName(topic),
                    partitions=tuple(
                        request_mod.ListOffsetsPartition(
                            partition_index=i32(p), timestamp=i64(timestamp)
                        )
                        for p in sorted(ps)
                    ),
                )
                for topic, ps in sorted(by_topic.items())
            ),
        ),
        response_mod.ListOffsetsResponse,
    )


def list_offsets_from_kio(resp: Any) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, partition) -> (error code, offset)."""
    return {
        (t.name, int(p.partition_index)): (int(p.error_code), int(p.offset))
        for t in resp.topics
        for p in t.partitions
    }


# -- DescribeConfigs (the group's session timeout) ------------------------------------------

#: ConfigResource.Type GROUP (KIP-848 group configurations, Apache Kafka 3.9+).
_RESOURCE_GROUP = 32
GROUP_SESSION_TIMEOUT_KEY = "consumer.session.timeout.ms"


def group_session_timeout_call(group_id: str, version: int) -> Call:
    """DescribeConfigs of the group's ``consumer.session.timeout.ms`` (the group's own value,
    else the broker's ``group.consumer.session.timeout.ms``: what the coordinator fences the
    member by)."""
    request_mod, response_mod = _DC[version]
    return (
        request_mod.DescribeConfigsRequest(
            resources=(
                request_mod.DescribeConfigsResource(
                    resource_type=i8(_RESOURCE_GROUP),
                    resource_name=group_id,
                    configuration_keys=(GROUP_SESSION_TIMEOUT_KEY,),
                ),
            ),
        ),
        response_mod.DescribeConfigsResponse,
    )


def group_session_timeout_from_kio(resp: Any) -> int | None:
    """The session timeout in ms, or None if the broker did not say (an error, no value)."""
    for result in resp.results:
        if int(result.error_code) != 0:
            return None
        for entry in result.configs:
            if entry.name == GROUP_SESSION_TIMEOUT_KEY and entry.value:
                try:
                    value = int(entry.value)
                except ValueError:
                    return None
                return value if value > 0 else None
    return None
