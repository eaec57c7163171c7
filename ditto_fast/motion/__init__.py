"""Audio-to-motion: conditions, LMDM window sampling, motion <-> keypoint conversion, stitching, controls (import
the modules: the package itself imports nothing, so the request's checks need no torch)."""
