"""The application-side view of offsets: committed offsets with their leader epoch and
metadata, the error a rejected commit raises, and the reading of an OffsetFetch answer.
Commits themselves are the network loop's (`consumer_sdk.membership.requests`)."""

from __future__ import annotations

from dataclasses import dataclass

from consumer_sdk.domain import OffsetFetchResponse
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.errors import BrokerResponseError, KafkaException, kafka_error

Partition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int = -1
    metadata: str | None = None


class CommitFailedError(KafkaException):
    """A commit was rejected; ``code`` tells why (e.g. STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID)."""

    def __init__(self, code: int, detail: str, *, retriable: bool = False) -> None:
        super().__init__(
            kafka_error(
                code, f"commit failed: {ErrorCode.name_of(code)}: {detail}", retriable=retriable
            )
        )

    @property
    def code(self) -> int:
        return int(self.args[0].code())

    @property
    def retriable(self) -> bool:
        return bool(self.args[0].retriable())


def committed_offsets(response: OffsetFetchResponse) -> dict[Partition, OffsetAndMetadata | None]:
    """An OffsetFetch answer as committed offsets (None where the group has none);
    ``BrokerResponseError`` for an error in the answer."""
    if response.error_code != 0:
        raise BrokerResponseError.from_code(response.error_code, "OffsetFetch")
    result: dict[Partition, OffsetAndMetadata | None] = {}
    for r in response.partitions:
        if r.error_code != 0:
            raise BrokerResponseError.from_code(
                r.error_code, f"OffsetFetch {r.topic}[{r.partition}]"
            )
        result[(r.topic, r.partition)] = (
            OffsetAndMetadata(r.offset, r.leader_epoch, r.metadata) if r.offset >= 0 else None
        )
    return result
