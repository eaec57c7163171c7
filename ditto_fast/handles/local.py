"""`LocalEngine`: the engine in this process, the one place the networks are loaded (a `Renderer` built). `render`,
`live` and the in-process Pipecat service take their renderer from it; the engine process (child.py) and the Ray
actor (ray_engine.py) run one inside and send its outcomes; the tests use it as the handle of an engine without a
process. Its render jobs go through outcome.py's state machine, its live sessions through engine_sessions.py, their
messages handed across in process (no socket)."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, Callable

from ditto_fast.handles import messages as m
from ditto_fast.handles.base import EngineDied, EngineJob, EngineState
from ditto_fast.handles.engine_sessions import EngineSessions
from ditto_fast.handles.live_link import LiveLink, SessionOrder, state_with
from ditto_fast.handles.outcome import answer, run_job

if TYPE_CHECKING:
    from ditto_fast.engine.options import EngineOptions
    from ditto_fast.engine.render_setup import RenderSetup
    from ditto_fast.engine.renderer import Renderer, RenderResult
    from ditto_fast.engine.stages import Progress


class LocalEngine:
    """A handle (base.EngineHandle) on an engine in this process, loaded by start() from `setup` (or `options`), or
    on a `renderer` loaded already. No crash isolation: a process's engines are process.ProcessEngine's.

    `tell`: where the messages of the sessions it carries for another process go (an engine process's socket); the
    sessions opened here with open_live() hear theirs in process."""

    kind = "in-process"

    def __init__(self, setup: RenderSetup | None = None, *, options: EngineOptions | None = None,
                 renderer: Renderer | None = None, name: str = "engine-0",
                 tell: Callable[[m.SessionMessage], None] | None = None):
        self.name, self._options, self._tell = name, options, tell
        self._setup = setup
        self._renderer = renderer
        self.setup = renderer.setup if renderer is not None else setup
        self.info: dict[str, Any] = {}
        self._state = EngineState(name, self.kind, state="idle" if renderer is not None else "starting",
                                  where=f"pid {os.getpid()}")
        self._links: dict[str, LiveLink] = {}
        self._lock = threading.Lock()
        self._sessions: EngineSessions | None = None

    # ------------------------------------------------------------------ its life
    def start(self) -> LocalEngine:
        """Load the networks (once; a renderer given is kept); DittoError if they cannot load. Returns the handle. The
        load goes into the first render's timings (as `render` says it) unless taken apart (Renderer.told_load)."""
        if self._renderer is None:
            from ditto_fast.engine.renderer import Renderer     # looked up now: a test may stand in for it

            self._state.state = "starting"
            try:
                self._renderer = Renderer(setup=self._setup, options=self._options)
            except BaseException as e:
                self._state.state, self._state.error = "dead", str(e)
                raise
            self.setup = self._renderer.setup
            self.info = {"pid": os.getpid(), "load_seconds": round(self._renderer.load_seconds, 3)}
        self._state.state, self._state.error = "idle", None
        return self

    @property
    def loaded(self) -> bool:
        return self._renderer is not None

    @property
    def renderer(self) -> Renderer:
        """The loaded networks (start() first)."""
        if self._renderer is None:
            raise RuntimeError(f"{self.name}: start() the engine before using its renderer")
        return self._renderer

    def restart(self) -> None:
        """A fresh engine: the networks loaded again (those given loaded are kept), the sessions ended first."""
        self._state.restarts += 1
        self._end_sessions("its engine restarted")
        if self._setup is not None or self._options is not None:
            self._renderer = None
        self.start()

    def state(self) -> EngineState:
        return state_with(self._state, self._links)

    def close(self) -> None:
        """End the sessions it carries cleanly (their files complete); the engine stays loaded for whoever holds it."""
        self._end_sessions("engine stopped")
        self._state.state = "dead" if self._renderer is None else "idle"

    # ------------------------------------------------------------------ render jobs
    def outcome(self, job: EngineJob, tick: Callable[[str, int, int], None] | None = None,
                commit: Callable[[], None] | None = None) -> tuple:
        """Render `job` on this engine; its outcome as plain data (outcome.py: what an engine process sends and a
        Ray actor returns). `tick` and `commit` may raise JobCancelled."""
        self._state.state, self._state.job = "busy", job.label or str(job.request.output)
        try:
            return run_job(self.renderer, job, tick or _quiet, commit)
        finally:
            self._state.state, self._state.job = "idle", None

    def render(self, job: EngineJob, progress: Progress | None = None,
               commit: Callable[[], None] | None = None) -> RenderResult:
        """Render `job` (see base.EngineHandle.render): its result, or EngineError, JobCancelled, EngineDied."""
        if self._renderer is None:
            self.start()
        return answer(self.outcome(job, progress, commit), self._died)

    def _died(self, why: str) -> EngineDied:
        self._state.last_death = why
        return EngineDied(f"{self.name} {why}")

    # ------------------------------------------------------------------ live sessions
    def hear(self, message: m.SessionMessage) -> None:
        """A message to a session this engine carries (from its link, or from an engine process's parent)."""
        self._carrier().hear(message)

    def open_live(self, order: SessionOrder, heard: Callable[[str, Any], None] | None = None) -> LiveLink:
        """Start the live session `order` on this engine, beside any job; its link, whose messages go straight to the
        session and back (`heard(event, detail)` hears ready, log, event, ended and failed)."""
        if self._renderer is None:
            self.start()
        link = LiveLink(order, self.hear, self.name, heard)
        with self._lock:
            self._links[order.id] = link
        self.hear(m.Open(order.id, order))
        return link

    def _carrier(self) -> EngineSessions:
        with self._lock:
            if self._sessions is None:
                self._sessions = EngineSessions(self.renderer, self._said)
            return self._sessions

    def _said(self, message: m.SessionMessage) -> None:
        """A session's message: to its link if it was opened here, else to `tell`."""
        link = self._links.get(message.id)
        if link is None:
            if self._tell is not None:
                self._tell(message)
            return
        link.hear(message)
        if not link.active:
            with self._lock:
                self._links.pop(link.id, None)

    def _end_sessions(self, why: str) -> None:
        with self._lock:
            sessions, self._sessions = self._sessions, None
        if sessions is not None:
            sessions.stop_all()
        with self._lock:
            links, self._links = list(self._links.values()), {}
        for link in links:                  # one whose session did not end in time
            link.lost(why)


def _quiet(stage: str, done: int, total: int) -> None:
    pass


def load_renderer(what: RenderSetup | EngineOptions) -> Renderer:
    """The networks loaded in this process for a resolved setup, or for engine options (resolved as they load)."""
    from ditto_fast.engine.options import EngineOptions

    if isinstance(what, EngineOptions):
        return LocalEngine(options=what).start().renderer
    return LocalEngine(what).start().renderer
