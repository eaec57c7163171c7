"""`serve --ray`: the server's jobs rendered by Ray actors (one engine per GPU, or per node without GPUs), each
engine loaded when the server starts; the queue, the checks and the API stay in the server. An actor renders the
clip the server checked (its audio decoded here and sent along), reports its progress when asked, and stops a
cancelled job at its next frame batch."""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path
from typing import Any

from ditto_fast.audio.decode import DecodedAudio
from ditto_fast.avatar import Avatar, store_root
from ditto_fast.batch.ray_actors import (BatchWorker, actor_ready, plan_actors, probe_folders, ray_options,
                                        remove_probes)
from ditto_fast.core.errors import DittoError, InputError
from ditto_fast.engine.clip import Clip
from ditto_fast.engine.open_avatars import OpenAvatars
from ditto_fast.engine.options import EngineOptions
from ditto_fast.engine.renderer import RenderResult
from ditto_fast.engine.request import RenderRequest
from ditto_fast.engine.stages import Progress
from ditto_fast.serve.worker import JobCancelled, LostEngine

NAMESPACE = "ditto-fast"        # the Ray namespace of the servers' actors
POLL_S = 0.5                    # how often a running job's progress is asked for (and its cancelling passed on)


class ServeActor(BatchWorker):
    """A Ray actor's engine for a server: loaded by ready(), then renders checked clips one at a time. Its methods
    run in two threads (max_concurrency=2), so progress() and cancel() answer while render() runs."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.state: tuple[str, int, int] | None = None
        self.cancelled: str | None = None

    def ready(self) -> dict[str, Any]:
        """As BatchWorker.ready(), with the networks loaded: a server's engines are warm before the first job."""
        if self.problem is None and self.renderer is None:
            from ditto_fast.engine.renderer import Renderer

            try:
                self.renderer = Renderer(setup=self.setup)
            except DittoError as e:
                self.problem = e
        return super().ready()

    def render(self, request: RenderRequest, audio: DecodedAudio, token: str) -> dict[str, Any]:
        """Render a request the server checked (`audio`: its decoding there), the avatar opened here from this
        node's store; `token` names this render for cancel(). The outcome as plain data: output and timings, or
        error and exit code, or cancelled."""
        self.state = None

        def tick(stage: str, done: int, total: int) -> None:
            if self.cancelled == token:
                raise JobCancelled()
            self.state = (stage, done, total)

        try:
            result = self._render(request, audio, tick)
        except JobCancelled:
            return {"cancelled": True}
        except DittoError as e:
            return {"error": str(e), "exit_code": e.exit_code}
        return {"output": str(result.output), "timings": result.timings, "warnings": list(result.warnings)}

    def progress(self) -> tuple[str, int, int] | None:
        """The running render's last (stage, done, total); None before its first."""
        return self.state

    def cancel(self, token: str) -> None:
        """Stop the render named `token` at its next frame batch (nothing is left at its output)."""
        self.cancelled = token


class RemoteError(DittoError):
    """A DittoError an actor's render ended with: its line and exit code, as `render` gives them."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class RayEngine:
    """One actor, as the server's render thread sees an engine (serve/worker.Engine): its avatars are opened here to
    check the jobs; the render runs on the actor, polled for progress."""

    def __init__(self, pool: RayPool, actor: Any, info: dict[str, Any]):
        self.pool, self.actor, self.setup = pool, actor, info["setup"]
        self.node, self.node_id = info["node"], info["node_id"]
        self.lost = False           # its actor died and no new one could start: it takes no more jobs

    def avatar(self, name: str) -> Avatar:
        return self.pool.avatars.get(name)

    def render(self, clip: Clip, progress: Progress | None = None) -> RenderResult:
        ray, token = self.pool.ray, uuid.uuid4().hex
        try:
            ref = self.actor.render.remote(clip.request, clip.audio, token)
            cancelled = False
            while not ray.wait([ref], timeout=POLL_S)[0]:
                state = ray.get(self.actor.progress.remote())
                if progress is not None and not cancelled:
                    try:
                        progress(*(state or ("starting", 0, 0)))
                    except JobCancelled:                # passed on; the actor stops at its next frame batch
                        self.actor.cancel.remote(token)
                        cancelled = True
            outcome = ray.get(ref)
        except ray.exceptions.RayActorError as e:
            lost = f"its Ray actor on {self.node} died ({type(e).__name__})"
            self.pool.replace(self)
            raise LostEngine(lost) from None
        if outcome.get("cancelled"):
            raise JobCancelled()
        if "error" in outcome:
            raise RemoteError(outcome["error"], outcome["exit_code"])
        return RenderResult(clip.output, outcome["timings"], None, tuple(outcome["warnings"]))


class RayPool:
    """The server's Ray actors, started (and their engines loaded) before it listens, killed when it stops."""

    def __init__(self, address: str, options: EngineOptions, workers: int | None):
        self.address, self.workers = address, workers
        self.options, self.check_setup = ray_options(options)
        self.avatars = OpenAvatars(self.check_setup.checkpoints)
        self.ray: Any = None
        self.engines: list[RayEngine] = []
        self._probes: dict[str, str] = {}
        self._locks: list[int] = []
        self._lock = threading.Lock()
        self._made = 0

    def start(self, ray: Any, folders: list[Path]) -> list[RayEngine]:
        """On the joined Ray: a token in the store and in each writable folder of `folders` (the outputs' roots),
        which each actor must read back; the actors started and each engine loaded. InputError if none can
        render."""
        self.ray = ray
        store = store_root() / "avatars"
        store.mkdir(parents=True, exist_ok=True)       # a server may start before the first avatar is registered
        self._probes, self._locks = probe_folders([store,
                                                   *(f for f in folders if os.access(f, os.W_OK))])
        count, self._share, resources = plan_actors(ray, self.options.device, self.workers)
        self._remote = ray.remote(max_concurrency=2, **resources)(ServeActor)
        actors = [self._new_actor() for _ in range(count)]
        problems = []
        refs = [a.ready.remote() for a in actors]          # the engines load side by side
        for actor, info in zip(actors, [actor_ready(ray, ref) for ref in refs]):
            if info["error"] is None:
                self.engines.append(RayEngine(self, actor, info))
            else:
                problems.append(f"{info['node']}: {info['error']}")
                ray.kill(actor)
        if not self.engines:
            raise InputError(f"--ray {self.address}: no Ray actor can render ({'; '.join(problems)[:1500]})")
        return self.engines

    def _new_actor(self) -> Any:
        """An actor named ditto-fast-serve-PID-N in the namespace ditto-fast (`ray list actors` shows whose it is)."""
        self._made += 1
        return self._remote.options(name=f"ditto-fast-serve-{os.getpid()}-{self._made}", namespace=NAMESPACE).remote(
            self.options, str(store_root()), self._probes, self._share)

    def replace(self, engine: RayEngine) -> None:
        """A new actor (its engine loaded) for `engine`'s, which died; if none can start, the engine is lost."""
        with self._lock:
            actor = self._new_actor()
            info = actor_ready(self.ray, actor.ready.remote())
            if info["error"] is not None:
                self.ray.kill(actor)
                engine.lost = True
                return
            engine.actor, engine.setup = actor, info["setup"]
            engine.node, engine.node_id = info["node"], info["node_id"]

    def describe(self) -> list[dict[str, Any]]:
        """Each actor's node, for the log and /healthz."""
        return [{"node": e.node, "node_id": e.node_id, "device": str(e.setup.device)} for e in self.engines]

    def close(self) -> None:
        remove_probes(self._probes, self._locks)
        if self.ray is None:
            return
        for engine in self.engines:
            self.ray.kill(engine.actor)
