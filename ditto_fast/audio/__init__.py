"""Audio stage: decoding/resampling to 16 kHz mono (decode.py), HuBERT features with Ditto's windowing (hubert.py) and
chunk by chunk for a live stream (stream_features.py);
the package itself imports nothing, so decoding needs no torch."""
