"""consumer_sdk: a pure-Python KIP-848 consumer group member for Apache Kafka.

Public names are imported lazily, so importing a submodule (for example the pytest plugin in
``consumer_sdk.testing``) does not load the whole client.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from consumer_sdk._version import __version__

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    from consumer_sdk.membership import CloseOption, MemberState
    from consumer_sdk.runtime.consumer import Consumer
    from consumer_sdk.runtime.group_member import GroupMember

logging.getLogger("consumer_sdk").addHandler(logging.NullHandler())

_EXPORTS = {
    "CloseOption": "consumer_sdk.membership",
    "Consumer": "consumer_sdk.runtime.consumer",
    "GroupMember": "consumer_sdk.runtime.group_member",
    "KafkaError": "confluent_kafka",
    "KafkaException": "confluent_kafka",
    "MemberState": "consumer_sdk.membership",
    "TopicPartition": "confluent_kafka",
}

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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'consumer_sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
