"""What /healthz says of each engine, as the people watching a server read it: an engine that carries live sessions
(and renders no job) is "streaming", not "idle", and says what it carries (its death under them its handle tells:
"died while carrying N live sessions")."""

from __future__ import annotations

from ditto_fast.handles.base import carrying


def engine_view(engine: dict) -> dict:
    """An engine's health JSON (EngineState.as_json) with `activity` (what it does now, in words) and, where it
    carries live sessions, the state "streaming" for "idle"."""
    view = dict(engine)
    carried = list(view.get("sessions") or [])
    if view.get("state") == "idle" and carried:
        view["state"] = "streaming"
    doing = [f"rendering job {view['job']}"] if view.get("state") == "busy" and view.get("job") else []
    doing += [carrying(len(carried))] if carried else []
    view["activity"] = ", ".join(doing) or view.get("state")
    return view
