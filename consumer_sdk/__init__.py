"""consumer_sdk: a pure-Python KIP-848 consumer group member for Apache Kafka."""

from __future__ import annotations

import logging

logging.getLogger("consumer_sdk").addHandler(logging.NullHandler())

__version__ = "0.1.0"
