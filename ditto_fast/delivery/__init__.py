"""Delivery: station profiles (container, codec, scan, tracks, loudness, timecode), loudness leveling, and the QC of
a written file against its profile (with the readers it uses: the file's facts, its 608 captions decoded back)."""
