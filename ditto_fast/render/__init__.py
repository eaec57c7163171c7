"""Compositing: fused warp + decode on the device, the putback of each crop into its plate (face mask, seam colour
match, the Cython blend kernel)."""
