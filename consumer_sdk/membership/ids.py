"""Client-generated member ids (KIP-1082)."""

from __future__ import annotations

import base64
import random
import uuid


def new_member_id(rng: random.Random) -> str:
    """A random UUID4 as 22 URL-safe base64 characters without padding, like Kafka's ``Uuid``.

    Ids starting with ``-`` are drawn again (the Java client avoids them too, so that the id can
    never be mistaken for a command-line flag), as is the all-zero id.
    """
    while True:
        value = uuid.UUID(int=rng.getrandbits(128), version=4)
        text = base64.urlsafe_b64encode(value.bytes).decode("ascii").rstrip("=")
        if value.int != 0 and not text.startswith("-"):
            return text
