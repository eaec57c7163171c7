"""A live session's states, declared once: the engine's link (handles/live_link.py), serve's session (which adds
`idle`) and both Pipecat faces report them in these words."""

from __future__ import annotations

STATES = ("starting", "streaming", "ending", "ended", "failed")
ACTIVE = ("starting", "streaming", "ending")        # the session still runs (or is about to)
IDLE = "idle"                                       # serve's: streaming, with no client and nothing left to say


def with_idle(states: tuple[str, ...]) -> tuple[str, ...]:
    """`states` with `idle` after `streaming` (serve's words for its sessions)."""
    at = states.index("streaming") + 1
    return states[:at] + (IDLE,) + states[at:]
