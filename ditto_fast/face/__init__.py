"""face stage."""
