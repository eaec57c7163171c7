"""Render stage: fused warp+decode, putback, writer."""
