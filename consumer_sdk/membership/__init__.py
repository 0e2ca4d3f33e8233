"""membership layer."""
