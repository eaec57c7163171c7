"""Ditto's eight emotion classes, in the order of the LMDM's emotion condition; light to import (the render
request's help and checks name them, conditions.py makes the vectors)."""

EMOTIONS = ("angry", "disgust", "fear", "happy", "neutral", "sad", "surprise", "contempt")
