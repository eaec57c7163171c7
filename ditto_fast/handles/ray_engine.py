"""An engine in a Ray actor (`EngineActor`), seen through the handle `RayEngine`; and `RayFleet`, the actors of one
batch or server: their plan (one per GPU, or per node without GPUs), the tokens by which each checks that it sees the
store and the outputs, their names, the doorway where they dial the driver back. An actor opens avatars from its own
node's view of the store; it carries render jobs and live sessions over the same wire as an engine process (wire.py,
engine_side.py), so a live session's speech, frames and events cross it as they cross an engine process's socket."""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import uuid
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Iterable

from ditto_fast.core.errors import DittoError, InputError, one_line
from ditto_fast.engine.options import EngineOptions
from ditto_fast.handles import messages as m
from ditto_fast.handles.base import EngineError, EngineLimits
from ditto_fast.handles.local import LocalEngine
from ditto_fast.handles.wire import DEATH_CHARS, Doorway, WiredEngine
from ditto_fast.media.filemode import give_usual_mode
from ditto_fast.media.partfiles import create_locked

NAMESPACE = "ditto-fast"        # the Ray namespace of named actors (a server's)


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
    skip finished jobs), loads the engine (at ready(load=True), or with its first job), then dials its driver (`wire`:
    the address, key and name RayFleet gives it) and serves it there as an engine process serves its parent
    (engine_side.serve_engine: render jobs, live sessions, the one handshake), on a thread of its own.

    `share`: on a CPU node, how many actors share its cores (torch gets an equal part of them; Ray starts every
    actor with OMP_NUM_THREADS=1, which left a CPU render on one core); None on a GPU node."""

    def __init__(self, options: EngineOptions, store: str, probes: dict[str, str], share: int | None = None,
                 wire: tuple | None = None):
        os.environ["DITTO_FAST_HOME"] = store
        self.problem: DittoError | None = None
        self.setup = None
        self.engine: LocalEngine | None = None         # the engine in this actor, loaded at ready(load=True) or a job
        self.wire, self.dialled, self.stopped = wire, False, False
        self._tell: Callable[[Any], None] = lambda message: None
        try:
            _check_visible(probes)
            import torch

            from ditto_fast.core.memory import reuse_freed_memory
            from ditto_fast.engine.render_setup import RenderSetup

            if share is not None:            # before the batch-size probe, which times the networks
                torch.set_num_threads(_cpu_threads(share))
            reuse_freed_memory()
            self.setup = RenderSetup.resolve(options)
            self.engine = LocalEngine(self.setup, tell=lambda message: self._tell(message))
        except DittoError as e:     # said by ready(): raised here it reaches the driver as a bare ActorDiedError
            self.problem = e

    def ready(self, load: bool = False) -> dict[str, Any]:
        """Where this actor runs (host name, Ray node id), its setup (what its outputs' digests are made with), and
        why it cannot render jobs (error None if it can); `load`: the networks loaded first. Able to render, it
        dials its driver."""
        if load:
            self._load()
        if self.problem is None and self.wire is not None and not self.dialled:
            self._dial()
        import torch

        return {"node": _node(), "node_id": _node_id(), "setup": self.setup, "pid": os.getpid(),
                "torch_threads": torch.get_num_threads(), "load_seconds": getattr(self, "load_seconds", None),
                "error": str(self.problem) if self.problem else None,
                "exit_code": self.problem.exit_code if self.problem else 0}

    def alive(self) -> bool:
        """Answered while the actor lives (its driver asks when the wire drops: a dead actor's call says why)."""
        return True

    def _load(self) -> None:
        if self.problem is None and not self.engine.loaded:
            try:
                self.load_seconds = self.engine.start().renderer.told_load()    # said when ready, not by a job
            except DittoError as e:
                self.problem = e

    def _dial(self) -> None:
        from multiprocessing.connection import Client

        address, authkey, name = self.wire
        try:
            conn = Client(tuple(address), authkey=authkey)
            conn.send(name)
        except (OSError, EOFError) as e:
            self.problem = InputError(f"cannot reach the driver at {address[0]}:{address[1]} from Ray node {_node()} "
                                      f"({e}); the driver's address must be reachable from every node")
            return
        self.dialled = True
        threading.Thread(target=self._serve, args=(conn,), name="ditto-fast-engine-wire", daemon=True).start()

    def engine_for(self, start: Any, tell: Callable[[Any], None]) -> LocalEngine:
        """The engine the driver's Start asks for: this actor's own (loaded, or loaded with its first job)."""
        self._tell = tell
        return self.engine

    def _serve(self, conn: Any) -> None:
        """The driver's engine until it says Stop (its sessions ended, the wire shut: the driver's ray.kill ends the
        actor, as Ray expects, not a worker's exit it would report as a crash) or is gone (the actor exits)."""
        from ditto_fast.handles.engine_side import serve_engine

        try:
            serve_engine(conn, self.engine_for, self._exit)
        except BaseException:  # noqa: BLE001 - a bug: said in the actor's log; the driver sees the wire drop
            import traceback

            traceback.print_exc()
            os._exit(1)
        self.stopped = True
        import socket

        with socket.socket(fileno=os.dup(conn.fileno())) as end:
            end.shutdown(socket.SHUT_RDWR)         # the driver reads the end of the wire

    def _exit(self, code: int) -> None:
        """The driver gone (or a render out of memory): the actor ends; after a Stop, the driver ends it."""
        if not self.stopped:
            os._exit(code)


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
    the store and the output folders, dialling the driver back at its doorway (wire.Doorway: the driver's Ray node
    address, a random key), and let go together. `name`: actors named NAME-PID-N in NAMESPACE (a server's, so `ray
    list actors` shows whose they are); None for unnamed ones."""

    def __init__(self, ray, options: EngineOptions, workers: int | None = None, name: str | None = None,
                 prepared: tuple[EngineOptions, Any] | None = None, limits: EngineLimits = EngineLimits()):
        """`prepared`: ray_options(options), when the caller has it already; `limits`: when an actor is taken for
        hung (its memory cap does not apply: Ray's own memory monitor kills actors)."""
        self.ray, self.workers, self.name, self.limits = ray, workers, name, limits
        self.options, self.check_setup = prepared or ray_options(options)
        self.handles: list[RayEngine] = []
        self.probes: dict[str, str] = {}
        self.doorway: Doorway | None = None
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
            self.doorway = self.doorway or Doorway(self.ray.util.get_node_ip_address())
        import ditto_fast.handles.ray_engine as module      # its classes as they are now (tests swap the actor)

        self._remote = self.ray.remote(**resources)(module.EngineActor)
        self.handles = [RayEngine(self, f"actor-{i}", load) for i in range(count)]
        return self.handles

    def new_actor(self) -> tuple[Any, str]:
        """A new actor, and the name it says when it dials the doorway."""
        self._made += 1
        remote = self._remote if self.name is None else self._remote.options(
            name=f"{self.name}-{os.getpid()}-{self._made}", namespace=NAMESPACE)
        from ditto_fast.core.home import store_root

        said = f"{self._made}-{uuid.uuid4().hex}"
        wire = (self.doorway.address, self.doorway.authkey, said)
        return remote.remote(self.options, str(store_root()), self.probes, self._share, wire), said

    def close(self) -> None:
        remove_probes(self.probes, self._locks)
        self.probes, self._locks = {}, []
        for handle in self.handles:
            handle.close()
        if self.doorway is not None:
            self.doorway.close()
            self.doorway = None


class RayEngine(WiredEngine):
    """A handle on one engine in a Ray actor (see base.EngineHandle), over the wire the actor dials back: render jobs
    and live sessions as an engine process carries them (wire.py); its node is known once started."""

    kind = "ray"
    noun = "its Ray actor"

    def __init__(self, fleet: RayFleet, name: str, load: bool):
        super().__init__(name, fleet.limits)
        self.fleet, self.load = fleet, load
        self.setup = None

    @property
    def ray(self):
        return self.fleet.ray

    @property
    def actor(self) -> Any:
        """The Ray actor now carrying the engine (None while there is none)."""
        return self._life

    def _launch(self) -> Connection:
        """Start an actor and wait for its answer (its engine loaded if `load`) and its call at the doorway;
        EngineError with the actor's own line (a node that does not see the store, say) if it cannot render."""
        actor, said = self.fleet.new_actor()
        self._life = actor
        self.info = actor_ready(self.ray, actor.ready.remote(self.load), self.limits.start_s)
        self._state.where = f"{self.info['node'] or 'unknown node'} (node id {self.info['node_id'][:12]})"
        conn = None
        if self.info["error"] is None:
            conn = self.fleet.doorway.take(said, DIAL_WAIT_S)
            if conn is None:
                self.info = {**self.info, "exit_code": 3, "error": f"its Ray actor on {self.info['node']} did not "
                             f"reach the driver within {DIAL_WAIT_S:g} s"}
        if conn is None:
            self._end(actor, False)
            self._life = None
            self._state.state, self._state.error = "dead", self.info["error"]
            raise EngineError(self.info["error"], self.info["exit_code"])
        self.setup = self.info["setup"]
        return conn

    def _start_message(self) -> m.Start:
        return m.Start(None, None)          # the actor loads its own setup; Ray's memory monitor, not a cap

    def _end(self, actor: Any, stacks: bool) -> None:
        try:
            self.ray.kill(actor)
        except Exception:  # noqa: BLE001 - gone already, or its cluster is
            pass

    def _death(self, actor: Any) -> str:
        """Why the actor is gone, as Ray says it, and its node."""
        try:
            self.ray.get(actor.alive.remote(), timeout=ASK_S)
            cause = "it dropped its connection to the driver"
        except self.ray.exceptions.RayActorError as e:
            lines = [ln.strip() for ln in str(e).splitlines() if "because" in ln]
            cause = f"{type(e).__name__}: {lines[-1].rstrip('.')}" if lines else type(e).__name__
        except Exception as e:  # noqa: BLE001 - a call that does not come back: the actor or its node is lost
            cause = f"it does not answer ({type(e).__name__})"
        return one_line(f"{cause}; on {self.info.get('node') or 'an unknown node'}", DEATH_CHARS - 50)


DIAL_WAIT_S = 30.0              # how long a ready actor may take to reach the driver's doorway
ASK_S = 10.0                    # how long an actor whose wire dropped has to answer whether it lives
