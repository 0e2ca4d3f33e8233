"""Offsets and metadata from the cluster, for the stream reader: watermarks, topics,
where partitions start (``startingOffsets`` / timestamps), with Spark's retry options.

Runs in the stream-reader process on Spark's thread, through one assign-only
``confluent_kafka.Consumer`` that never joins a group.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from spark_integration.offsets import EARLIEST, LATEST, Partition
from spark_integration.options import SourceOptions

__all__ = ["UNKNOWN", "ClusterOffsets", "Watermarks"]

log = logging.getLogger("spark_integration")
_KAFKA_LOG = logging.getLogger("spark_integration.librdkafka")

#: Low and high watermarks, and the partitions the broker does not know.
Watermarks = tuple[dict[Partition, int], dict[Partition, int], list[Partition]]

#: Threads issuing one lookup's per-partition requests together.
_LOOKUP_THREADS = 8

#: Errors meaning "this topic or partition does not exist (any more)".
UNKNOWN = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.UNKNOWN_TOPIC_ID,
    }
)


class ClusterOffsets:
    """Cluster lookups of one source (its client is created on first use)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._client: KafkaConsumer | None = None
        self._threads: ThreadPoolExecutor | None = None

    def close(self) -> None:
        """Close the client (in a thread, bounded: librdkafka may wait on a broker)."""
        import threading

        threads, self._threads = self._threads, None
        if threads is not None:
            threads.shutdown(wait=False)
        client, self._client = self._client, None
        if client is not None:
            closer = threading.Thread(target=client.close, daemon=True)
            closer.start()
            closer.join(5.0)

    def client(self) -> KafkaConsumer:
        if self._client is None:
            self._client = KafkaConsumer(
                {**self.options.fetch_config("driver"), "logger": _KAFKA_LOG}
            )
        return self._client

    def retrying(self, what: str, call: Callable[[], Any]) -> Any:
        """``call`` with fetchOffset.numRetries retries, fetchOffset.retryIntervalMs apart."""
        o = self.options
        for attempt in range(o.fetch_retries + 1):
            try:
                return call()
            except KafkaException as exc:
                error = exc.args[0]
                if error.code() in UNKNOWN or error.fatal() or attempt == o.fetch_retries:
                    raise
                log.info("kip848: %s failed (%s); retrying", what, error.str())
                time.sleep(o.fetch_retry_interval_ms / 1000)
        raise AssertionError("unreachable")

    def watermarks(self, parts: Iterable[Partition]) -> Watermarks:
        """Low and high watermarks, and the partitions the broker does not know."""
        low: dict[Partition, int] = {}
        high: dict[Partition, int] = {}
        unknown: list[Partition] = []
        todo = sorted(parts)
        self.client()  # created here, not by the pool's threads at once
        # One broker round trip per partition, issued together (librdkafka releases the GIL
        # while it waits): a lookup costs about one round trip, not one per partition.
        if len(todo) > 1:
            futures = [self._pool().submit(self._watermark, tp) for tp in todo]
            wait(futures)  # all of them, even if one failed: none outlives this call
            answers = [f.result() for f in futures]
        else:
            answers = [self._watermark(tp) for tp in todo]
        for (t, p), answer in zip(todo, answers, strict=True):
            if isinstance(answer, KafkaException):
                if answer.args[0].code() not in UNKNOWN:
                    raise KafkaException(
                        KafkaError(
                            answer.args[0].code(),
                            f"kip848: the offsets of {t}[{p}]: {answer.args[0].str()}",
                        )
                    ) from None
                unknown.append((t, p))
                continue
            low[(t, p)], high[(t, p)] = answer
        return low, high, unknown

    def _watermark(self, tp: Partition) -> tuple[int, int] | KafkaException:
        t, p = tp
        client = self.client()
        try:
            lo, hi = self.retrying(
                f"the watermarks of {t}[{p}]",
                lambda: client.get_watermark_offsets(
                    TopicPartition(t, p), timeout=10.0, cached=False
                ),
            )
        except KafkaException as exc:
            return exc
        return int(lo), int(hi)

    def _pool(self) -> ThreadPoolExecutor:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(_LOOKUP_THREADS, thread_name_prefix="kip848-lookup")
        return self._threads

    def starting_offsets(
        self, parts: list[Partition], marks: Watermarks | None = None
    ) -> dict[Partition, int]:
        """``startingTimestamp`` > ``startingOffsetsByTimestamp`` > ``startingOffsets``
        (``marks``: the partitions' watermarks, if just looked up)."""
        if not parts:
            return {}
        low, high, _ = marks or self.watermarks(parts)
        o = self.options
        stamps: dict[Partition, int] = {}
        for p in parts:
            if o.starting_timestamp is not None:
                stamps[p] = o.starting_timestamp
            elif o.starting_by_timestamp and p in o.starting_by_timestamp:
                stamps[p] = o.starting_by_timestamp[p]
        out: dict[Partition, int] = {}
        if stamps:
            out.update(self.offsets_for_times(stamps, high, "starting"))
        for p in parts:
            if p in out:
                continue
            spec = o.starting_offsets
            wanted = (
                spec.get(p, EARLIEST)
                if isinstance(spec, dict)
                else (EARLIEST if spec == "earliest" else LATEST)
            )
            out[p] = (
                low.get(p, 0)
                if wanted == EARLIEST
                else high.get(p, 0)
                if wanted == LATEST
                else wanted
            )
        return out

    def offsets_for_times(
        self, stamps: Mapping[Partition, int], high: Mapping[Partition, int], which: str
    ) -> dict[Partition, int]:
        """The first offset at or after each timestamp (Kafka's ListOffsets by time)."""
        found = self.retrying(
            "offsets for timestamps",
            lambda: self.client().offsets_for_times(
                [TopicPartition(t, p, ts) for (t, p), ts in sorted(stamps.items())], timeout=10.0
            ),
        )
        out: dict[Partition, int] = {}
        missing = []
        for tp in found:
            p = (tp.topic, tp.partition)
            if tp.error is not None:
                raise KafkaException(tp.error)
            if tp.offset >= 0:
                out[p] = tp.offset
            elif which == "starting" and self.options.timestamp_strategy == "latest":
                out[p] = high[p]
            else:
                missing.append(f"{tp.topic}[{tp.partition}] (timestamp {stamps[p]})")
        if missing:
            option = (
                "startingTimestamp"
                if self.options.starting_timestamp is not None
                else "startingOffsetsByTimestamp"
            )
            raise ValueError(
                f"kip848: {option}: no record at or after the timestamp in {', '.join(missing)}; "
                "set startingOffsetsByTimestampStrategy=latest to start those partitions at "
                "the latest offset instead"
            )
        return out
