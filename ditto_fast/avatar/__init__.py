"""avatar stage."""
