"""coordinator layer."""
