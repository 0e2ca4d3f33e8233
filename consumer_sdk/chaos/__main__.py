"""``python -m consumer_sdk.chaos``: the chaos soak (and, internally, its member processes)."""

from __future__ import annotations

import sys

from consumer_sdk.chaos.driver import main

sys.exit(main())
