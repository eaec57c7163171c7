"""Face stage: mediapipe landmarks, crop geometry, eye features (import the modules: the package itself imports
nothing)."""
