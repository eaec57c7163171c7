"""Delivery: station profiles (container, codec, scan, tracks, loudness, timecode), loudness leveling, and the QC of
a written file against its profile (with the file reader it uses)."""
