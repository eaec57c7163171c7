"""Batch scale-out on Ray: one engine per actor (an actor per GPU, or per CPU node), jobs handed to actors
as they free up, results streamed back to the driver, which alone writes the report. The driver checks every
job, skips those finished by the setups the actors report, and sends each of the others its decoded audio; an
actor opens the avatar from its own view of the store."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

import torch

from ditto_fast.audio.decode import DecodedAudio
from ditto_fast.batch.jobs import Job
from ditto_fast.batch.runner import Book, run_job, run_jobs
from ditto_fast.core.errors import EXIT_INTERNAL, DittoError, InputError, UsageError
from ditto_fast.engine.options import EngineOptions
from ditto_fast.engine.render_setup import RenderSetup
from ditto_fast.engine.renderer import RenderResult
from ditto_fast.engine.request import RenderRequest
from ditto_fast.engine.stages import Progress
from ditto_fast.media.filemode import give_usual_mode
from ditto_fast.media.partfiles import create_locked

INSTALL_HINT = ('Ray is not installed; install it with: pip install -e ".[ray]" '
                '(or pip install "ray[client]>=2.9,<3")')
CLIENT_HINT = ('a ray:// address needs the Ray Client (grpcio), which this install lacks; install it with: '
               'pip install -e ".[ray]" (or pip install "ray[client]>=2.9,<3")')
TIMEOUT_ENV = "DITTO_FAST_RAY_TIMEOUT"
CONNECT_TIMEOUT_S = 30.0        # how long joining a cluster may take before we say it does not answer


def _ray():
    try:
        import ray
    except ImportError:
        raise UsageError(f"--ray: {INSTALL_HINT}") from None
    return ray


def _cpu_threads(share: int) -> int:
    """Torch threads for one of `share` CPU actors on a node: an equal part of the cores this process may use."""
    return max(1, len(os.sched_getaffinity(0)) // max(1, share))


class BatchWorker:
    """The body of a Ray actor: checks it sees the shared paths and resolves its setup (which the driver uses to
    skip finished jobs), then renders the jobs it gets with one engine, loaded with the first.

    `share`: on a CPU node, how many actors share its cores (torch gets an equal part of them; Ray starts
    every actor with OMP_NUM_THREADS=1, which left a CPU render on one core); None on a GPU node."""

    def __init__(self, options: EngineOptions, store: str, probes: dict[str, str], share: int | None = None):
        os.environ["DITTO_FAST_HOME"] = store
        self.problem: DittoError | None = None
        self.setup: RenderSetup | None = None
        self.renderer = None
        try:
            _check_visible(probes)
            from ditto_fast.core.memory import reuse_freed_memory

            if share is not None:            # before the CPU precision and batch probes, which time the networks
                torch.set_num_threads(_cpu_threads(share))
            reuse_freed_memory()
            self.setup = RenderSetup.resolve(options)
        except DittoError as e:     # said by ready(): raised here it reaches the driver as a bare ActorDiedError
            self.problem = e

    def ready(self) -> dict[str, Any]:
        """Where this actor runs (host name, Ray node id), its setup (what its outputs' digests are made with), and
        why it cannot render jobs (error None if it can)."""
        return {"node": _node(), "node_id": _node_id(), "setup": self.setup,
                "error": str(self.problem) if self.problem else None,
                "exit_code": self.problem.exit_code if self.problem else 0}

    def run(self, job: Job, audio: DecodedAudio) -> Job:
        """Render one job the driver checked and found unfinished for this actor's setup (its audio decoded there,
        sent along)."""
        run_job(job, lambda: self._render(job.request, audio))
        job.extra["node"], job.extra["node_id"] = _node(), _node_id()
        job.extra["torch_threads"] = torch.get_num_threads()
        return job


    def _render(self, request: RenderRequest, audio: DecodedAudio, progress: Progress | None = None) -> RenderResult:
        """Check `request` with its decoded `audio` against the avatar opened here, from this node's view of the
        store, and render it; the engine is loaded for the first (its load time goes into that render's timings)."""
        from ditto_fast.engine.clip import check_clip
        from ditto_fast.engine.renderer import Renderer

        if self.renderer is None:
            self.renderer = Renderer(setup=self.setup)
        clip = check_clip(request, self.renderer.avatar(request.avatar), self.setup.config, audio=audio)
        return self.renderer.render(clip, progress=progress)


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


def _node() -> str:
    import socket

    return socket.gethostname()


def _node_id() -> str:
    """The Ray node id of this worker (two nodes on one host have the same host name, not the same id)."""
    import ray

    return ray.get_runtime_context().get_node_id()


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


def ray_options(options: EngineOptions) -> tuple[EngineOptions, RenderSetup]:
    """`options` as every node resolves them (the checkpoints as an absolute root), and the setup the driver checks
    jobs with (checkpoints, avatars, inputs): no device, fp32 and batch 1, so that no `auto` starts a probe there;
    the actors resolve the real setup."""
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


def remove_probes(probes: dict[str, str], locks: list[int]) -> None:
    for path in probes:
        Path(path).unlink(missing_ok=True)
    for fd in locks:
        os.close(fd)


def start_ray(address: str, temp_dir: str | None = None):
    """Join the cluster at `address` (within `connect_timeout()` seconds), or start one on this machine for
    "local"; a running one is reused."""
    ray = _ray()
    if address != "local":
        _check_address(address)
        timeout = connect_timeout()
    if not ray.is_initialized():
        if address == "local":
            ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR, _temp_dir=temp_dir)
        else:
            _join(ray, address, timeout)
    return ray


def connect_timeout() -> float:
    """Seconds to wait for a cluster to answer: $DITTO_FAST_RAY_TIMEOUT, else 30."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return CONNECT_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= 86400:
        raise UsageError(f"{TIMEOUT_ENV}={raw[:40]}: not a number of seconds; give e.g. 30 (or unset it)")
    return seconds


def _check_address(address: str) -> None:
    """A malformed address, or a ray:// one without the Ray Client installed, is bad usage (exit 2)."""
    client = address.startswith("ray://")
    if address != "auto":
        try:
            parts = urlsplit("//" + address.removeprefix("ray://"))
            ok = bool(parts.hostname) and bool(parts.port) and not (parts.path or parts.query or
                                                                         parts.fragment or parts.username)
        except ValueError:              # a port that is not a number, or out of range
            ok = False
        if not ok:
            raise UsageError(f"--ray {address[:200]}: not a Ray address; give local, auto, HOST:PORT (the head's "
                             "GCS port, 6379 by default) or ray://HOST:PORT (the Ray Client's, 10001 by default)")
    if client:
        try:
            import grpc  # noqa: F401 - what the Ray Client needs and the minimal `ray` lacks
        except ImportError:
            raise UsageError(f"--ray {address}: {CLIENT_HINT}") from None


def _join(ray, address: str, timeout: float) -> None:
    """ray.init(address) in a thread given `timeout` seconds: Ray itself retries an address that does not
    answer for about 12 minutes. A cluster that does not answer in time is exit 3, one that refuses us exit 3."""
    outcome: list[BaseException] = []

    def connect() -> None:
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            outcome.append(e)

    thread = threading.Thread(target=connect, name="ditto-fast-ray-connect", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():               # left to Ray's own retries; the process ends before they do
        raise InputError(f"--ray {address}: no Ray cluster answered within {timeout:g} s; check the address and "
                         f"that the cluster is up (or give it longer with {TIMEOUT_ENV}=SECONDS)")
    if outcome:
        e = outcome[0]
        why = _last_cause(e)
        if isinstance(e, ValueError):
            raise UsageError(f"--ray {address}: not an address Ray accepts ({why})") from None
        if isinstance(e, (ConnectionError, RuntimeError)):
            raise InputError(f"--ray {address}: cannot join the Ray cluster ({why})") from None
        raise e


def _last_cause(e: BaseException) -> str:
    """The last line of the innermost cause of `e` (Ray wraps why it could not connect, an authentication token
    missing say, as a traceback's text in a RuntimeError under a bare ConnectionError)."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[-1] if lines else type(e).__name__


def run_batch_ray(jobs: list[Job], options: EngineOptions, *, address: str = "local", workers: int | None = None,
                  force: bool = False, fail_fast: bool = False, report: str | Path | None = None,
                  progress: Progress | None = None, on_dispatch: Callable[[Job, Any], None] | None = None,
                  warn: Callable[[str], None] | None = None) -> list[Job]:
    """Run `jobs` on Ray actors (see runner.run_jobs); a job whose actor dies is retried once on another actor. An
    actor that cannot render (its node does not see the store, say) gets no job: `warn` hears why, once a node,
    and the report's "ray_nodes" lists every node's actors and what stopped them."""
    options, check_setup = ray_options(options)         # a missing checkpoint is said before Ray starts
    with ray_session(address) as ray:
        return run_jobs(jobs, RayActors(ray, options, check_setup, workers, progress, on_dispatch, warn), force=force,
                        fail_fast=fail_fast, report=report)


@contextlib.contextmanager
def ray_session(address: str):
    """Ray joined (or started) at `address` for a batch, and left at its end if joined here. Meanwhile stdout is
    stderr: Ray prints its raylet's messages (a worker that died, say) on stdout, which is the batch's summary's."""
    ours = not _ray().is_initialized()
    with contextlib.redirect_stdout(sys.stderr):
        try:
            yield start_ray(address)
        finally:
            ray = _ray()
            if ours and ray.is_initialized():   # stops Ray's listener threads, flushes what they held
                ray.shutdown()


class RayActors:
    """Executes checked jobs on Ray actors, one engine each (an actor per GPU, or per node without GPUs), handing
    each actor a job as it frees up; `progress` hears the frames of finished jobs. Finished jobs are skipped by
    the setup each actor reports, before any job goes to it."""

    def __init__(self, ray, options: EngineOptions, check_setup: RenderSetup, workers: int | None,
                 progress: Progress | None, on_dispatch: Callable[[Job, Any], None] | None,
                 warn: Callable[[str], None] | None):
        """`options` and `check_setup` as ray_options() gives them."""
        self.ray, self.options, self.check_setup, self.workers = ray, options, check_setup, workers
        self.progress, self.on_dispatch, self.warn = progress, on_dispatch, warn
        self.render_setup = None
        self.extra: dict[str, Any] = {"ray_nodes": []}          # in the report beside the jobs
        self.actors: list[Any] = []
        self.probes: dict[str, str] = {}
        self.locks: list[int] = []

    def start(self, book: Book) -> None:
        """Visibility tokens in the store and the output folders, and the actors started."""
        from ditto_fast.avatar import store_root

        ray, todo = self.ray, book.queue
        self.total = sum(book.clips[j.index].frames for j in todo)
        count, share, resources = plan_actors(ray, self.options.device, self.workers, most=len(todo))
        if todo:
            self.probes, self.locks = probe_folders([store_root() / "avatars", *(j.output.parent for j in todo)])
        remote = ray.remote(**resources)(BatchWorker)
        self.actors = [remote.remote(self.options, str(store_root()), self.probes, share)
                       for _ in range(max(0, count))]

    def execute(self, book: Book) -> None:
        ray, progress = self.ray, self.progress
        starting = {a.ready.remote(): a for a in self.actors}   # an actor gets jobs once it says it can render
        seen: dict[str, dict[str, Any]] = {}                    # Ray node id -> its actors and what stopped them
        unable: dict[str, Any] | None = None                    # the last actor that could not render, and why
        retried: set[int] = set()
        running: dict[Any, tuple[Job, Any]] = {}
        free: list[Any] = []
        done_frames = 0
        while book.queue or running:
            while free and (job := book.take()) is not None:
                actor = free.pop(0)
                if progress and not running and not done_frames:   # the rate's clock starts with the first job
                    progress("frames of finished jobs", 0, self.total)
                running[actor.run.remote(job, book.clips[job.index].audio)] = (job, actor)
                if self.on_dispatch:
                    self.on_dispatch(job, actor)
            if not running and not starting:
                if book.queue:      # every actor is gone
                    why = f" ({unable['error']})" if unable else " (see the failed jobs for why)"
                    book.fail_queued(f"not run: no Ray actor is left{why}",
                                     unable["exit_code"] if unable else EXIT_INTERNAL)
                break
            ready, _ = ray.wait([*running, *starting], num_returns=1)
            if ready[0] in starting:
                actor = starting.pop(ready[0])
                info = actor_ready(ray, ready[0])
                if _note_node(seen, info, self.warn):
                    free.append(actor)
                    # before any job goes there: a rerun loads no network to skip its jobs
                    self.total -= sum(j.frames for j in book.skip_finished(info["setup"]))
                else:
                    unable = info
                    ray.kill(actor)
                self.extra["ray_nodes"] = list(seen.values())
                continue
            job, actor = running.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayActorError as e:
                if job.index not in retried:
                    retried.add(job.index)
                    book.again(job)
                else:
                    job.fail(f"its Ray actor died twice ({type(e).__name__}); render it alone to see why",
                             EXIT_INTERNAL)
                    job.extra["attempts"] = 2
                continue
            _copy_outcome(result, job)
            job.extra["attempts"] = 2 if job.index in retried else 1     # 2: its first actor died
            free.append(actor)
            done_frames += book.clips[job.index].frames
            if progress:
                progress("frames of finished jobs", done_frames, self.total)
            book.write()

    def close(self) -> None:
        remove_probes(self.probes, self.locks)
        for a in self.actors:
            self.ray.kill(a)


def actor_ready(ray, ref) -> dict[str, Any]:
    """An actor's answer to ready(): its node and why it cannot render (error None if it can)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayActorError as e:    # died while starting (out of memory, its node lost, a bug)
        cause = _actor_error(e)
        return {"node": None, "node_id": getattr(e, "node_id", None) or "unknown",
                "error": str(cause) if cause else f"its Ray actor died while starting ({type(e).__name__}); "
                                                  "see the Ray logs of its node",
                "exit_code": cause.exit_code if cause else 1}


def _note_node(seen: dict[str, dict[str, Any]], info: dict[str, Any], warn: Callable[[str], None] | None) -> bool:
    """Count a started actor on its node's record; an actor that cannot render puts its reason there (`warn`
    hears it once a node). Whether the actor can render."""
    node = seen.setdefault(info["node_id"], {"node": info["node"], "node_id": info["node_id"], "actors": 0,
                                             "error": None})
    if info["error"] is None:
        node["actors"] += 1
        return True
    if node["error"] is None:
        node["error"] = info["error"]
        if warn:
            where = f"{info['node']} (node id {info['node_id'][:12]})" if info["node"] else "unknown node"
            warn(f"Ray {where}: no job runs there: {info['error']}")
    return False


def _actor_error(e: BaseException) -> DittoError | None:
    """The DittoError an actor's constructor raised, if Ray kept it as the cause of its death."""
    for _ in range(4):
        if isinstance(e, DittoError):
            return e
        e = getattr(e, "cause", None)
        if not isinstance(e, BaseException):
            return None
    return None


def _copy_outcome(src: Job, dst: Job) -> None:
    dst.status, dst.error, dst.exit_code = src.status, src.error, src.exit_code
    dst.frames, dst.seconds, dst.extra = src.frames, src.seconds, src.extra
