"""Render stage: fused warp+decode, putback, plate reader, writer."""
