"""Encoding: the writer as one ffmpeg process (video and audio), the containers and codecs of a plain output, the
soundtrack's channels."""
