"""The package version (kept apart from __init__ to avoid import cycles)."""

__version__ = "0.1.0"
