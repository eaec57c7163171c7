"""What /healthz says of each engine, as the people watching a server read it: an engine that carries live sessions
(and renders no job) is "streaming", not "idle", and says what it carries; an engine that died under live sessions
says so, not "died while idle" (its handle, handles/process.py, counts an engine without a job as idle)."""

from __future__ import annotations

import re
from typing import Any, Iterable

IDLE_DEATH = re.compile(r"died while idle \((?P<cause>.*)\)$")


def carrying(n: int) -> str:
    return f"carrying {n} live session{'s' if n != 1 else ''}"


def engine_view(engine: dict, sessions: Iterable[Any] = ()) -> dict:
    """An engine's health JSON (EngineState.as_json) with `activity` (what it does now, in words) and, where it
    carries live sessions, the state "streaming" for "idle"; where its last death, told "died while idle", ended
    live sessions (`sessions`: the server's, with their engine and error), that death said as "died while carrying
    N live sessions"."""
    view = dict(engine)
    carried = list(view.get("sessions") or [])
    if view.get("state") == "idle" and carried:
        view["state"] = "streaming"
    doing = [f"rendering job {view['job']}"] if view.get("state") == "busy" and view.get("job") else []
    doing += [carrying(len(carried))] if carried else []
    view["activity"] = ", ".join(doing) or view.get("state")
    death = IDLE_DEATH.match(view.get("last_death") or "")
    if death is not None:
        lost = sum(1 for s in sessions if _lost_with(s, view.get("name"), death["cause"]))
        if lost:
            said = f"died while {carrying(lost)} ({death['cause']})"
            if view.get("error") == view["last_death"]:
                view["error"] = said
            view["last_death"] = said
    return view


def _lost_with(session: Any, engine: str | None, cause: str) -> bool:
    """Whether a served session failed because its engine `engine` died of `cause` (what its link was told)."""
    link = getattr(session, "link", None)
    return link is not None and link.engine == engine and session.state == "failed" and \
        (session.error or "") == f"its engine {engine} died ({cause})"
