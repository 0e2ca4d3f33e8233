"""Library logging with the reference's line prefix (client id, group id, member id, epoch)."""

from __future__ import annotations

import logging
from collections.abc import Callable

LOGGER = logging.getLogger("consumer_sdk.membership")

#: ``LOGGER``'s own cache of its `logging.Logger.isEnabledFor` answers (CPython keeps one
#: dict per logger for its life and clears it whenever any level changes). A per-heartbeat
#: path reads ``LEVELS_CACHED.get(level, True)`` first and calls ``isEnabledFor`` only when
#: that is not a cached False: the same answer, without a Python call while the level is
#: off. (Without such a cache, ``{}``: always the call.)
LEVELS_CACHED: dict[int, bool] = vars(LOGGER).get("_cache", {})


class MemberLog:
    """Prefixes every line with ``[Consumer clientId=…, groupId=…, memberId=…, epoch=…]``."""

    def __init__(
        self, client_id: str, group_id: str, member: Callable[[], tuple[str, int]]
    ) -> None:
        self._head = f"[Consumer clientId={client_id}, groupId={group_id}"
        self._member = member

    def _prefix(self) -> str:
        member_id, epoch = self._member()
        return f"{self._head}, memberId={member_id}, epoch={epoch}] "

    def enabled(self, level: int) -> bool:
        """Whether a line at ``level`` is logged: guards arguments that cost to compute."""
        return LOGGER.isEnabledFor(level)

    def debug(self, msg: str, *args: object) -> None:
        if LOGGER.isEnabledFor(logging.DEBUG):
            LOGGER.debug(self._prefix() + msg, *args)

    def info(self, msg: str, *args: object) -> None:
        if LOGGER.isEnabledFor(logging.INFO):
            LOGGER.info(self._prefix() + msg, *args)

    def warning(self, msg: str, *args: object) -> None:
        if LOGGER.isEnabledFor(logging.WARNING):
            LOGGER.warning(self._prefix() + msg, *args)

    def error(self, msg: str, *args: object) -> None:
        if LOGGER.isEnabledFor(logging.ERROR):
            LOGGER.error(self._prefix() + msg, *args)
