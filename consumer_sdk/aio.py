"""asyncio face of the SDK: `AIOConsumer` and `AIOGroupMember` (see docs/asyncio.md).

Same configuration, semantics and errors as ``consumer_sdk.Consumer`` / ``GroupMember``, as
coroutines on the running event loop; heartbeats stay on the process's network loop.
"""

from __future__ import annotations

from consumer_sdk.runtime.aio import AIOConsumer, AIOGroupMember

__all__ = ["AIOConsumer", "AIOGroupMember"]
