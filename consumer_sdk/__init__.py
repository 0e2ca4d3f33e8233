"""consumer_sdk: a pure-Python KIP-848 consumer group member for Apache Kafka."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from consumer_sdk._version import __version__
from consumer_sdk.membership import CloseOption, MemberState
from consumer_sdk.runtime.consumer import Consumer
from consumer_sdk.runtime.group_member import GroupMember

logging.getLogger("consumer_sdk").addHandler(logging.NullHandler())


__all__ = [
    "CloseOption",
    "Consumer",
    "GroupMember",
    "KafkaError",
    "KafkaException",
    "MemberState",
    "TopicPartition",
    "__version__",
]
