"""``python -m consumer_sdk.simulation``."""

from __future__ import annotations

import sys

from consumer_sdk.simulation.cli import main

sys.exit(main())
