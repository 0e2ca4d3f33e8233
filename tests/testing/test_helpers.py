"""Small helpers of consumer_sdk.testing that the real-broker beds depend on."""

from __future__ import annotations

import base64

from consumer_sdk.testing._helpers import kafka_uuid


def test_kafka_uuids_never_start_with_a_dash() -> None:
    # One random id in 64 starts with "-", which kafka.tools.StorageTool reads as an option
    # (a CI run's netns bed failed to format its storage that way): 20,000 draws would meet
    # about 300 of them.
    ids = [kafka_uuid() for _ in range(20_000)]
    assert not [i for i in ids if i.startswith("-")]
    assert len(set(ids)) == len(ids)
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
