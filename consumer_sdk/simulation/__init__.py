"""simulation layer."""
