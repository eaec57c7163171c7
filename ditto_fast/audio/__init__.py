"""audio stage."""
