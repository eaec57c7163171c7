"""Hostile inputs that the fault campaign (scripts/faults/fuzz.py) and the tests both build."""

from __future__ import annotations


def alias_bomb(tail: str) -> str:
    """A billion-laughs YAML (nine levels of nine aliases: 9^9 values once expanded) ending in `tail`, which may
    use the last level as `*i`."""
    levels = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))
    return levels + tail


def reference_bomb(levels: int, width: int) -> list:
    """A list nested `levels` deep whose every level holds `width` references to the one below: a few bytes
    pickled, width ** levels entries walked as a tree."""
    a: list = []
    for _ in range(levels):
        a = [a] * width
    return a
