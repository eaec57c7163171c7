"""An engine in a Ray actor (`EngineActor`), seen through the handle `RayEngine`; and `RayFleet`, the actors of one
batch or server: their plan (one per GPU, or per node without GPUs), the tokens by which each checks that it sees the
store and the outputs, their names. An actor opens avatars from its own node's view of the store."""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable

from ditto_fast.core.errors import DittoError, InputError, UsageError
from ditto_fast.engine.options import EngineOptions
from ditto_fast.handles.base import (EngineDied, EngineError, EngineJob, EngineLimits, EngineState, JobCancelled,
                                     JobTimedOut)
from ditto_fast.handles.live_link import SessionOrder
from ditto_fast.handles.local import LocalEngine
from ditto_fast.handles.outcome import answer
from ditto_fast.media.filemode import give_usual_mode
from ditto_fast.media.partfiles import create_locked

NAMESPACE = "ditto-fast"        # the Ray namespace of named actors (a server's)
POLL_S = 0.5                    # how often a running job's progress is asked for (and a cancel passed on)
COMMIT_WAIT_S = 120.0           # how long an actor waits for its driver's word on a finished file


def _cpu_threads(share: int) -> int:
    """Torch threads for one of `share` CPU actors on a node: an equal part of the cores this process may use."""
    return max(1, len(os.sched_getaffinity(0)) // max(1, share))


def _node() -> str:
    import socket

    return socket.gethostname()


def _node_id() -> str:
    """The Ray node id of this worker (two nodes on one host have the same host name, not the same id)."""
    import ray

    return ray.get_runtime_context().get_node_id()


def _check_visible(probes: dict[str, str]) -> None:
    """InputError unless this node reads back every token the driver wrote (the store and the output folders)."""
    for path, token in probes.items():
        try:
            seen = Path(path).read_text()
        except OSError:
            seen = None
        if seen != token:
            raise InputError(f"{Path(path).parent}: not visible from Ray node {_node()}; put the avatar store "
                             "(DITTO_FAST_HOME) and the outputs on a path every node mounts")


class EngineActor:
    """The body of a Ray actor: checks that it sees the shared paths and resolves its setup (which the driver uses to
    skip finished jobs), loads the engine (at ready(load=True), or with its first job), then renders checked jobs
    one at a time. Its methods run in two threads (max_concurrency=2): progress(), cancel() and answer() are
    answered while render() runs.

    `share`: on a CPU node, how many actors share its cores (torch gets an equal part of them; Ray starts every
    actor with OMP_NUM_THREADS=1, which left a CPU render on one core); None on a GPU node."""

    def __init__(self, options: EngineOptions, store: str, probes: dict[str, str], share: int | None = None):
        os.environ["DITTO_FAST_HOME"] = store
        self.problem: DittoError | None = None
        self.setup = None
        self.engine: LocalEngine | None = None         # the engine in this actor, loaded at ready(load=True) or a job
        self.state: tuple | None = None                 # ("progress", token, stage, done, total) or ("commit", token)
        self.cancelled: set[str] = set()
        self.answers: dict[str, str] = {}
        self.answered = threading.Condition()
        try:
            _check_visible(probes)
            import torch

            from ditto_fast.core.memory import reuse_freed_memory
            from ditto_fast.engine.render_setup import RenderSetup

            if share is not None:            # before the batch-size probe, which times the networks
                torch.set_num_threads(_cpu_threads(share))
            reuse_freed_memory()
            self.setup = RenderSetup.resolve(options)
            self.engine = LocalEngine(self.setup)
        except DittoError as e:     # said by ready(): raised here it reaches the driver as a bare ActorDiedError
            self.problem = e

    def ready(self, load: bool = False) -> dict[str, Any]:
        """Where this actor runs (host name, Ray node id), its setup (what its outputs' digests are made with), and
        why it cannot render jobs (error None if it can); `load`: the networks loaded first."""
        if load:
            self._load()
        import torch

        return {"node": _node(), "node_id": _node_id(), "setup": self.setup, "pid": os.getpid(),
                "torch_threads": torch.get_num_threads(), "load_seconds": getattr(self, "load_seconds", None),
                "error": str(self.problem) if self.problem else None,
                "exit_code": self.problem.exit_code if self.problem else 0}

    def _load(self) -> None:
        if self.problem is None and not self.engine.loaded:
            try:
                self.load_seconds = self.engine.start().renderer.told_load()    # said when ready, not by a job
            except DittoError as e:
                self.problem = e

    def render(self, job: EngineJob, gated: bool = False) -> tuple:
        """Render `job` (`gated`: the rename waits for the driver's answer()); its outcome (outcome.py), or
        ("unanswered",) when the driver said nothing of a finished file."""
        token = job.token

        def tick(stage: str, done: int, total: int) -> None:
            if token in self.cancelled:
                raise JobCancelled()
            self.state = ("progress", token, stage, done, total)

        def commit() -> None:
            with self.answered:
                self.state = ("commit", token)
                if not self.answered.wait_for(lambda: token in self.answers or token in self.cancelled,
                                              COMMIT_WAIT_S):
                    raise _Unanswered()
                if self.answers.pop(token, None) != "go":
                    raise JobCancelled()

        self.state = None
        try:
            self._load()
            if self.problem is not None:
                return ("error", str(self.problem), self.problem.exit_code)
            return self.engine.outcome(job, tick, commit if gated else None)
        except _Unanswered:
            return ("unanswered",)
        finally:
            self.cancelled.discard(token)

    def progress(self) -> tuple | None:
        """The running render's last progress, or that its file is complete and waits for answer()."""
        return self.state

    def cancel(self, token: str) -> None:
        """Stop the render named `token` at its next frame batch (nothing is left at its output)."""
        with self.answered:
            self.cancelled.add(token)
            self.answered.notify_all()

    def answer(self, token: str, verdict: str) -> None:
        """The driver's word on a complete file: "go" (rename it into place) or "cancel"."""
        with self.answered:
            self.answers[token] = verdict
            self.answered.notify_all()


def probe_folders(folders: Iterable[Path]) -> tuple[dict[str, str], list[int]]:
    """A token file in each folder (the store and the outputs'), which each actor must read back; and the
    descriptors holding their flocks (a killed driver's tokens are unlocked, and removed by the next batch there)."""
    token = uuid.uuid4().hex
    probes: dict[str, str] = {}
    locks: list[int] = []
    for d in dict.fromkeys(folders):
        try:
            path, fd = create_locked(d / "ditto-fast", "probe")     # .ditto-fast.probeXXXXXXXX
        except OSError as e:
            remove_probes(probes, locks)
            raise InputError(f"{d}: cannot write the token by which Ray actors check they see this folder "
                             f"({e.strerror or e}); make it writable") from None
        locks.append(fd)
        probes[str(path)] = token
        os.write(fd, token.encode())
        give_usual_mode(path)           # readable by a node's workers running as another user
    return probes, locks


def remove_probes(probes: dict[str, str], locks: list[int]) -> None:
    for path in probes:
        Path(path).unlink(missing_ok=True)
    for fd in locks:
        os.close(fd)


def ray_options(options: EngineOptions) -> tuple[EngineOptions, Any]:
    """`options` as every node resolves them (the checkpoints as an absolute root), and the setup the driver checks
    jobs with (checkpoints, avatars, inputs): no device, fp32 and batch 1, so that no `auto` starts a probe there;
    the actors resolve the real setup."""
    from ditto_fast.engine.render_setup import RenderSetup

    options = dataclasses.replace(options, checkpoints=str(options.find_checkpoints().root.resolve()))
    return options, RenderSetup.resolve(dataclasses.replace(options, device="cpu", precision="fp32", batch_size=1,
                                                            encoder="software"))


def plan_actors(ray, device: str, workers: int | None, most: int | None = None
                ) -> tuple[int, int | None, dict[str, Any]]:
    """How many actors to start: `workers` if given, else one per GPU (one per node without GPUs; `--device cpu`
    renders on CPU actors even where the cluster has GPUs), never more than the GPUs nor `most`; how many actors
    share a CPU node's cores (None on GPUs); and the Ray resources each asks for."""
    gpus = 0 if device == "cpu" else int(ray.cluster_resources().get("GPU", 0))
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    count = workers or (gpus or nodes)
    if gpus:
        count = min(count, gpus)
    if most is not None:
        count = min(count, most)
    if gpus:
        return count, None, {"num_gpus": 1}
    # spread over the nodes, each actor's torch on its part of the node's cores
    return count, math.ceil(count / max(1, nodes)), {"num_cpus": 1, "scheduling_strategy": "SPREAD"}


class _Unanswered(BaseException):
    """The driver did not say go or cancel for a finished file in time (it is gone, or its thread hangs)."""


def actor_ready(ray, ref, timeout: float | None = None) -> dict[str, Any]:
    """An actor's answer to ready(): its node and why it cannot render (error None if it can); an actor that does
    not answer within `timeout` seconds (its resources never free: a GPU node lost, say) cannot render."""
    try:
        return ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        return {"node": None, "node_id": "unknown", "setup": None, "exit_code": 3,
                "error": f"its Ray actor did not start within {timeout:g} s (no node has the resources it asks "
                         "for, or it hangs while loading)"}
    except ray.exceptions.RayActorError as e:    # died while starting (out of memory, its node lost, a bug)
        cause = _actor_error(e)
        return {"node": None, "node_id": getattr(e, "node_id", None) or "unknown", "setup": None,
                "error": str(cause) if cause else f"its Ray actor died while starting ({type(e).__name__}); "
                                                  "see the Ray logs of its node",
                "exit_code": cause.exit_code if cause else 1}


def _actor_error(e: BaseException) -> DittoError | None:
    """The DittoError an actor's constructor raised, if Ray kept it as the cause of its death."""
    for _ in range(4):
        if isinstance(e, DittoError):
            return e
        e = getattr(e, "cause", None)
        if not isinstance(e, BaseException):
            return None
    return None


class RayFleet:
    """The Ray actors of one batch or server on a joined cluster: planned, checked against the tokens written into
    the store and the output folders, and let go together. `name`: actors named NAME-PID-N in NAMESPACE (a server's,
    so `ray list actors` shows whose they are); None for unnamed ones."""

    def __init__(self, ray, options: EngineOptions, workers: int | None = None, name: str | None = None,
                 prepared: tuple[EngineOptions, Any] | None = None, limits: EngineLimits = EngineLimits()):
        """`prepared`: ray_options(options), when the caller has it already; `limits`: when an actor is taken for
        hung (its memory cap does not apply: Ray's own memory monitor kills actors)."""
        self.ray, self.workers, self.name, self.limits = ray, workers, name, limits
        self.options, self.check_setup = prepared or ray_options(options)
        self.handles: list[RayEngine] = []
        self.probes: dict[str, str] = {}
        self._locks: list[int] = []
        self._made = 0
        self._remote: Any = None
        self._share: int | None = None

    def plan(self, folders: Iterable[Path], most: int | None = None, load: bool = False,
             writable: Iterable[Path] = ()) -> list[RayEngine]:
        """The tokens written into `folders` (the store's and the outputs') and into those of `writable` this process
        can write (a server's roots), the engines planned (at most `most`), not started; `load`: each loads its
        networks when started."""
        count, self._share, resources = plan_actors(self.ray, self.options.device, self.workers, most)
        if count:
            self.probes, self._locks = probe_folders([*folders, *(f for f in writable if os.access(f, os.W_OK))])
        import ditto_fast.handles.ray_engine as module      # its classes as they are now (tests swap the actor)

        self._remote = self.ray.remote(max_concurrency=2, **resources)(module.EngineActor)
        self.handles = [RayEngine(self, f"actor-{i}", load) for i in range(count)]
        return self.handles

    def new_actor(self) -> Any:
        self._made += 1
        remote = self._remote if self.name is None else self._remote.options(
            name=f"{self.name}-{os.getpid()}-{self._made}", namespace=NAMESPACE)
        from ditto_fast.core.home import store_root

        return remote.remote(self.options, str(store_root()), self.probes, self._share)

    def close(self) -> None:
        remove_probes(self.probes, self._locks)
        self.probes, self._locks = {}, []
        for handle in self.handles:
            handle.close()


class RayEngine:
    """A handle on one engine in a Ray actor (see base.EngineHandle); its node is known once started."""

    kind = "ray"

    def __init__(self, fleet: RayFleet, name: str, load: bool):
        self.fleet, self.name, self.load = fleet, name, load
        self.setup = None
        self.info: dict[str, Any] = {}
        self.actor: Any = None
        self._state = EngineState(name, self.kind)

    @property
    def ray(self):
        return self.fleet.ray

    def start(self) -> None:
        """Start the actor and wait for its answer (its engine loaded if `load`); EngineError with the actor's own
        line (a node that does not see the store, say) if it cannot render."""
        self.actor = self.fleet.new_actor()
        self.info = actor_ready(self.ray, self.actor.ready.remote(self.load), self.fleet.limits.start_s)
        self._state.where = f"{self.info['node'] or 'unknown node'} (node id {self.info['node_id'][:12]})"
        if self.info["error"] is not None:
            self.ray.kill(self.actor)
            self.actor = None
            self._state.state, self._state.error = "dead", self.info["error"]
            raise EngineError(self.info["error"], self.info["exit_code"])
        self.setup = self.info["setup"]
        self._state.state, self._state.error = "idle", None

    def restart(self) -> None:
        self._state.restarts += 1
        self._state.state = "restarting"
        self.close()
        self.start()

    def state(self) -> EngineState:
        return self._state

    def close(self) -> None:
        if self.actor is not None:
            self.ray.kill(self.actor)
            self.actor = None
        self._state.state = "dead"

    def render(self, job: EngineJob, progress: Callable[[str, int, int], None] | None = None,
               commit: Callable[[], None] | None = None) -> Any:
        """Render `job` on the actor (see base.EngineHandle.render), polled for progress every POLL_S; an actor that
        makes no progress for the fleet's stall limit or does not answer a poll for its heartbeat limit is killed
        (EngineDied); one whose job runs past the job limit is killed too (JobTimedOut)."""
        if self._state.state == "dead" or self.actor is None:
            self.restart()
        self._state.state, self._state.job = "busy", job.label or str(job.request.output)
        try:
            outcome = self._render(job, progress, commit)
        except self.ray.exceptions.RayActorError as e:
            why = f"its Ray actor on {self.info.get('node')} died ({type(e).__name__})"
            self._state.last_death = why
            self.close()
            raise EngineDied(f"{self.name} {why}") from None
        except (EngineDied, JobCancelled, JobTimedOut):
            raise
        except BaseException:           # an interrupt, or this process's own trouble: the actor is let go at once
            self.close()
            raise
        self._state.state, self._state.job = "idle", None
        if outcome[0] == "unanswered":
            outcome = ("fatal", "it had no word from its driver on a finished file")
        return answer(outcome, self._gone)

    def _gone(self, why: str) -> EngineDied:
        """The actor let go (`why`: out of memory, no word on a finished file); the EngineDied to raise."""
        self._state.last_death = why
        self.close()
        return EngineDied(f"{self.name} {why}")

    def open_live(self, order: SessionOrder, heard: Any = None) -> Any:
        """Refused: a Ray actor carries render jobs only."""
        raise UsageError("live sessions run on an engine process of the server's own host, with its GPU; this "
                         "server renders on Ray actors (--ray), which take render jobs only: start a second "
                         "`ditto-fast serve` without --ray (another DITTO_FAST_HOME and --port) for live sessions")

    def _render(self, job: EngineJob, progress: Callable[[str, int, int], None] | None,
                commit: Callable[[], None] | None) -> tuple:
        ray, actor, token, limits = self.ray, self.actor, job.token, self.fleet.limits
        cancelled = answered = False
        started = changed = time.monotonic()
        last: tuple | None = None
        ref = actor.render.remote(job, commit is not None)
        while not ray.wait([ref], timeout=POLL_S)[0]:
            try:
                state = ray.get(actor.progress.remote(), timeout=limits.beat_s)
            except ray.exceptions.GetTimeoutError:
                self._hung(f"its actor did not answer for {limits.beat_s:g} s")
            now = time.monotonic()
            self._state.last_beat = time.time()
            if state != last:
                last, changed = state, now
            elif now - changed > limits.stall_s:
                self._hung(f"it made no progress for {limits.stall_s:g} s")
            if limits.job_s and now - started > limits.job_s:      # the job's length, not a hang
                self._state.last_death = f"stopped: its job ran past the job limit of {limits.job_s:g} s"
                self.close()
                raise JobTimedOut(limits.job_s)
            if state is None or state[1] != token:
                continue
            if state[0] == "commit" and not answered:
                answered = True
                verdict = "cancel" if cancelled else "go"
                try:
                    if commit is not None and not cancelled:
                        commit()
                except JobCancelled:
                    verdict = "cancel"
                actor.answer.remote(token, verdict)
            elif state[0] == "progress" and progress is not None and not cancelled:
                try:
                    progress(*state[2:])
                except JobCancelled:                # passed on; the actor stops at its next frame batch
                    actor.cancel.remote(token)
                    cancelled = True
        return ray.get(ref)

    def _hung(self, why: str) -> None:
        self._state.last_death = f"hung: {why}; it was killed"
        self.close()
        raise EngineDied(f"{self.name} {self._state.last_death}")
