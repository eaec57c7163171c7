"""`ditto-fast serve`: jobs from a durable queue, rendered by engines loaded once, each in a process of its own (one
per GPU, or one on a CPU host) or a Ray actor, so that a render that dies takes only its engine; the jobs come from
the HTTP API (uvicorn, localhost by default) and from watch folders. One server per home (a lock). Stopped by SIGINT
or SIGTERM: each running job stops at its next frame batch and is queued again for the next start."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO

from ditto_fast.core.errors import DittoError, InputError, Terminated, UsageError, one_line
from ditto_fast.core.files import read_input
from ditto_fast.core.home import store_root
from ditto_fast.engine.options import EngineOptions
from ditto_fast.serve.hosts import is_loopback
from ditto_fast.serve.jobs.callbacks import parse_networks
from ditto_fast.serve.options import ServeOptions

if TYPE_CHECKING:
    from ditto_fast.engine.render_setup import RenderSetup
    from ditto_fast.handles.base import EngineHandle

TOKEN_MAX_BYTES = 4096


def read_token(path: Path) -> str:
    """The bearer token in `path` (its first line); InputError if missing or unreadable, UsageError if short."""
    token = read_input(path, TOKEN_MAX_BYTES, "a token file").decode("utf-8", "replace").strip()
    if len(token) < 16:
        raise UsageError(f"{path}: the token must be at least 16 characters; write a long random one "
                         "(e.g. `openssl rand -hex 32 > FILE`)")
    return token


def check_options(opts: ServeOptions) -> str | None:
    """UsageError for options that cannot serve safely or at all; the token (None without --token-file)."""
    if not is_loopback(opts.host) and opts.token_file is None:
        raise UsageError(f"--host {opts.host} serves beyond this machine: give --token-file FILE (a bearer token), "
                         "or keep the default --host 127.0.0.1")
    if opts.workers is not None and opts.ray is None:
        raise UsageError("--workers goes with --ray")
    if opts.engine_memory is not None and opts.ray is not None:
        raise UsageError("--engine-memory caps an engine process here; with --ray, Ray's own memory monitor "
                         "guards its actors: leave it out")
    if (opts.watch is None) != (opts.out is None):
        raise UsageError("--watch IN and --out OUT go together")
    if opts.watch is not None and not opts.watch.is_dir():
        raise UsageError(f"{opts.watch}: --watch must be an existing folder")
    if opts.watch is not None and not isinstance(opts.defaults.get("avatar"), str):
        raise UsageError("--watch needs --avatar NAME: the anchor of the files dropped there (a sidecar <stem>.json "
                         "may name another for its file)")
    for root in opts.roots:
        if not root.is_dir():
            raise UsageError(f"{root}: --root must be an existing folder")
    parse_networks(opts.callback_allow)
    if opts.uploads is not None:
        from ditto_fast.serve.checks import confine

        confine(opts.uploads, [r.resolve() for r in roots_of(opts)], "--uploads folder")
    token = read_token(opts.token_file) if opts.token_file else None
    with socket.socket(socket.AF_INET6 if ":" in opts.host else socket.AF_INET) as probe:
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((opts.host, opts.port))
        except OSError as e:
            raise UsageError(f"cannot listen on {opts.host}:{opts.port} ({e.strerror or e}); choose another --port "
                             "or --host") from None
    return token


def roots_of(opts: ServeOptions) -> list[Path]:
    """The folders a server's jobs may use: --root (default: the current folder) and the watch folders."""
    return [*opts.roots, *([opts.watch, opts.out] if opts.watch else [])] or [Path.cwd()]


def uploads_default(opts: ServeOptions) -> Path:
    """Where uploads go without --uploads: uploads/ in the first --root, else in --out (never in a watch folder)."""
    return (opts.roots[0] if opts.roots else opts.out or Path.cwd()) / "uploads"


def json_log(stream: TextIO, quiet: bool) -> Callable[[dict], None]:
    """One JSON line per event on `stream` (a station's log shipper reads them); `quiet`: errors only."""
    lock = threading.Lock()

    def log(event: dict) -> None:
        if quiet and not event.get("error"):
            return
        line = json.dumps({"ts": round(time.time(), 3), **event}, default=str)
        with lock:
            stream.write(line + "\n")
            stream.flush()
    return log


def serve(options: EngineOptions, opts: ServeOptions, stream: TextIO = sys.stderr) -> None:
    """Check the options (before the networks load), load the engine, open the queue, start the render thread and
    the watch folder, serve the API until SIGINT or SIGTERM (a clean stop); then stop the render thread (its job
    queued again) and return."""
    token = check_options(opts)
    log = json_log(stream, opts.quiet)
    roots = roots_of(opts)
    if opts.out is not None:
        opts.out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        from ditto_fast.serve.home_lock import lock_home

        stack.enter_context(lock_home(store_root() / "serve"))       # before the queue opens or an engine loads
        try:
            handles, setup, engine_info = _engines(options, opts, roots, stack, log)
            _serve(handles, setup, engine_info, opts, roots, token, log)
        except (KeyboardInterrupt, Terminated):     # uvicorn passes the signal on once it has stopped: a clean stop
            pass


def _engines(options: EngineOptions, opts: ServeOptions, roots: list[Path], stack: contextlib.ExitStack,
             log: Callable[[dict], None]) -> tuple[list[EngineHandle], RenderSetup, dict[str, Any]]:
    """The engine handles, each engine started and loaded (engine processes here: one per GPU, or one on a CPU host;
    or one Ray actor per GPU or node), let go when `stack` closes; the setup jobs are checked with; and what the log
    and /healthz say of the engines."""
    from ditto_fast.handles.base import EngineLimits

    t0 = time.perf_counter()
    limits = EngineLimits(beat_s=opts.heartbeat_timeout, stall_s=opts.stall_timeout, job_s=opts.job_timeout,
                          memory_bytes=int(opts.engine_memory * (1 << 30)) if opts.engine_memory else None)
    if opts.ray is None:
        from ditto_fast.engine.render_setup import RenderSetup
        from ditto_fast.handles.process import ProcessEngine

        setup = RenderSetup.resolve(options)
        if setup.device.type == "cuda" and limits.memory_bytes:
            raise UsageError("--engine-memory caps a CPU engine's address space; CUDA reserves more address space "
                             "than any such cap allows: leave it out on a GPU (or give --device cpu)")
        gpus = _gpu_count() if setup.device.type == "cuda" else 0
        handles = [ProcessEngine(setup, name=f"engine-{i}", limits=limits,
                                 env={"CUDA_VISIBLE_DEVICES": _visible_gpu(i)} if gpus > 1 else None,
                                 output=lambda line: log({"engine_said": line}))
                   for i in range(max(1, gpus))]
        for handle in handles:
            stack.callback(handle.close)
        _start_all(handles, log, every=True)
        return handles, setup, {"seconds": round(time.perf_counter() - t0, 2), "device": str(setup.device)}
    from ditto_fast.handles.ray_cluster import ray_session
    from ditto_fast.handles.ray_engine import RayFleet

    ray = stack.enter_context(ray_session(opts.ray))
    fleet = RayFleet(ray, options, opts.workers, name="ditto-fast-serve", limits=limits)
    stack.callback(fleet.close)
    store = store_root() / "avatars"
    store.mkdir(parents=True, exist_ok=True)        # a server may start before the first avatar is registered
    handles = _start_all(fleet.plan([store], load=True, writable=roots), log, every=False)
    return handles, fleet.check_setup, {"seconds": round(time.perf_counter() - t0, 2), "ray": opts.ray}


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def _visible_gpu(i: int) -> str:
    """The i-th GPU this process may use, as CUDA_VISIBLE_DEVICES names it for one engine."""
    import os

    given = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return given[i] if i < len(given) else str(i)


def _start_all(handles: list[EngineHandle], log: Callable[[dict], None], every: bool) -> list[EngineHandle]:
    """Start the engines side by side; those that started. `every`: the first refusal stops the server (its line
    and exit code); else only when none starts (InputError naming why each could not)."""
    errors: dict[int, DittoError] = {}

    def start(i: int) -> None:
        try:
            handles[i].start()
        except DittoError as e:
            errors[i] = e
        except Exception as e:  # noqa: BLE001 - Ray's own errors, a broken pipe: this engine cannot start
            errors[i] = InputError(one_line(f"{handles[i].name} could not start: {type(e).__name__}: {e}", 500))
    threads = [threading.Thread(target=start, args=(i,), name=f"ditto-fast-start-{i}") for i in range(len(handles))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors and every:
        raise errors[min(errors)]
    for i, e in sorted(errors.items()):
        log({"event": "engine down", "engine": handles[i].name, "where": handles[i].state().where, "error": str(e)})
    started = [h for i, h in enumerate(handles) if i not in errors]
    if not started:
        why = "; ".join(f"{handles[i].state().where or handles[i].name}: {e}" for i, e in sorted(errors.items()))
        raise InputError(f"no engine can render: {why[:1500]}")
    return started


def _serve(handles: list[EngineHandle], setup: RenderSetup, engine_info: dict[str, Any], opts: ServeOptions,
           roots: list[Path], token: str | None, log: Callable[[dict], None]) -> None:
    import uvicorn

    from ditto_fast.engine.open_avatars import OpenAvatars
    from ditto_fast.media.claims import remove_dead_writers
    from ditto_fast.serve.app import make_app
    from ditto_fast.serve.hosts import AllowedHosts
    from ditto_fast.serve.jobs.accept import Acceptor
    from ditto_fast.serve.jobs.callbacks import CallbackPolicy, CallbackSender
    from ditto_fast.serve.jobs.dispatch import Dispatcher
    from ditto_fast.serve.jobs.lease import Heartbeat
    from ditto_fast.serve.jobs.queue import JobQueue
    from ditto_fast.serve.jobs.watch import WatchFolder
    from ditto_fast.serve.live.playlists import OpenPlaylists
    from ditto_fast.serve.live.sessions import LiveSessions
    from ditto_fast.serve.metrics import Metrics
    from ditto_fast.serve.page.api import PageFiles

    queue = JobQueue(store_root() / "serve" / "jobs.sqlite")
    metrics = Metrics(queue)
    for job in queue.recover(opts.max_crashes):         # what a server that is gone was rendering
        if job["output"]:                               # its engine's claim and partial file, once its encoder ended
            remove_dead_writers(job["output"])
        metrics.crashed(job)
        if job["status"] != "queued":
            metrics.ended(job)
        log({"job": job["id"], "state": job["status"], "why": "its server died while rendering it",
             "crashes": job["crashes"], **({"error": job["error"]} if job["status"] != "queued" else {})})
    playlists = OpenPlaylists(store_root() / "serve" / "live")
    playlists.recover(log)                              # what sessions of a server that is gone left open
    log({"event": "engine loaded", **engine_info, "engines": [h.state().as_json() for h in handles],
         "queued": queue.counts()["queued"]})
    policy = CallbackPolicy(parse_networks(opts.callback_allow))
    avatars = OpenAvatars(setup.checkpoints)            # opened once for the checks of every job
    acceptor = Acceptor(queue, setup, roots, avatars=avatars.get, callbacks=policy)
    callbacks = CallbackSender(queue, policy, log)
    heartbeat = Heartbeat(queue.heartbeat, log)
    live = LiveSessions(handles, setup, roots, avatars.get, log, opts.max_live, opts.live_idle_timeout,
                        network_outputs=opts.live_outputs == "any", playlists=playlists) if opts.max_live else None
    files = PageFiles(acceptor.roots, (opts.uploads or uploads_default(opts)).absolute(),
                      store_root() / "serve" / "previews", opts.max_upload_mb << 20)
    dispatcher = Dispatcher(handles, queue, metrics, log, avatars, setup, audio=acceptor.decoded, callbacks=callbacks,
                            max_crashes=opts.max_crashes, at_start=acceptor.at_start,
                            hold=(lambda: live.active) if live else None, previews=files.previews)
    metrics.live_sessions = live
    watch = WatchFolder(opts.watch, opts.out, opts.defaults, acceptor, queue, dispatcher.notify, log, opts.settle_s,
                        opts.poll_s) if opts.watch else None
    app = make_app(queue, acceptor, dispatcher, metrics, token, engine_info, watch=watch, live=live, files=files,
                   hosts=AllowedHosts(opts.host, opts.port, opts.allow_host))
    listening = {"event": "listening", "url": f"http://{opts.host}:{opts.port}", "roots": [str(r) for r in roots],
                 "watch": str(opts.watch) if opts.watch else None}
    server = _bound_server(uvicorn.Config(app, host=opts.host, port=opts.port, log_level="warning", access_log=False,
                                          lifespan="off"), lambda: log(listening))
    heartbeat.start()
    if live:
        live.start()
    callbacks.start()
    dispatcher.start()
    if watch:
        watch.start()
    try:
        server.run()                                    # "listening" is logged once the port is bound
    except SystemExit:
        if server.started:
            raise
        raise UsageError(f"cannot listen on {opts.host}:{opts.port} (taken since serve started?); choose another "
                         "--port or --host") from None
    finally:
        if watch:
            watch.stop()
        if live:
            live.close()
        dispatcher.stop()
        callbacks.stop(timeout=15)  # what is not sent yet is sent after the next start
        heartbeat.stop()
        log({"event": "stopped", "queued": queue.counts()["queued"]})


def _bound_server(config: Any, bound: Callable[[], None]) -> Any:
    """A uvicorn server for `config` that calls `bound()` once its port is bound, before the first request."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)      # exits (SystemExit) when the port cannot be bound
            if self.started:
                bound()
    return Server(config)
