"""motion stage."""
