"""assignors layer."""
