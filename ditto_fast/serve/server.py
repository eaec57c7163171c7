"""`ditto-fast serve`: one process, one engine loaded once, jobs from a durable queue rendered one at a time; the
jobs come from the HTTP API (uvicorn, localhost by default) and from watch folders. Stopped by SIGINT or SIGTERM:
the running job stops at its next frame batch and is queued again for the next start."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import sys
import threading
import time
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO

from ditto_fast.core.errors import Terminated, UsageError
from ditto_fast.core.files import read_input
from ditto_fast.core.home import store_root
from ditto_fast.engine.options import EngineOptions

if TYPE_CHECKING:
    from ditto_fast.engine.render_setup import RenderSetup

DEFAULT_PORT = 8750
TOKEN_MAX_BYTES = 4096


def _option(default: Any = None, *, flags: tuple[str, ...] = (), kind: str = "text",
            range: tuple[float, float] | None = None, multiple: bool = False, help: str = "") -> Any:
    """A serve option: `flags` its command-line spelling; `kind` text or path; a number within `range`; `multiple`:
    repeatable (a list)."""
    meta = {"flags": flags, "kind": kind, "range": range, "multiple": multiple, "help": help}
    return field(default_factory=list, metadata=meta) if multiple else field(default=default, metadata=meta)


@dataclass
class ServeOptions:
    """What `serve` was started with (engine options aside); the command's options are made from these fields."""

    host: str = _option("127.0.0.1", flags=("--host",),
                        help="Address to listen on; anything beyond this machine needs --token-file.")
    port: int = _option(DEFAULT_PORT, flags=("--port",), range=(1, 65535))
    token_file: Path | None = _option(flags=("--token-file",), kind="path",
                                      help="A file holding the bearer token every API request must carry.")
    roots: list[Path] = _option(flags=("--root",), kind="path", multiple=True,
                                help="A folder the jobs' files may lie in (repeatable; the watch folders count) "
                                     "[default: the current folder].")
    watch: Path | None = _option(flags=("--watch",), kind="path",
                                 help="A watch folder: each speech file dropped in it becomes a job once it stops "
                                      "growing.")
    out: Path | None = _option(flags=("--out",), kind="path", help="With --watch: where the outputs go.")
    settle_s: float = _option(5.0, flags=("--settle",), range=(0.5, 600),
                              help="Seconds a dropped file's size and time must stay the same before it is taken.")
    poll_s: float = _option(2.0, flags=("--poll",), range=(0.1, 60), help="Seconds between looks at the watch folder.")
    ray: str | None = _option(flags=("--ray",),
                              help="Render on Ray actors, one engine each (one per GPU, or per node without GPUs): "
                                   "'local' starts Ray here, ADDRESS joins a cluster (pip extra [ray]); the queue and "
                                   "the API stay in this process.")
    workers: int | None = _option(flags=("--workers",), range=(1, 1024),
                                  help="With --ray: at most N actors [default: one per GPU, or per node without GPUs].")
    defaults: dict[str, Any] = field(default_factory=dict)     # a watch folder's request fields
    quiet: bool = False

    def __post_init__(self) -> None:
        """The roots as a list; the defaults as a job line would give them: unset ones left out, paths absolute."""
        self.roots = list(self.roots)
        self.defaults = {k: (str(v.absolute()) if isinstance(v, Path) else v) for k, v in self.defaults.items()
                         if v is not None}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    if (opts.watch is None) != (opts.out is None):
        raise UsageError("--watch IN and --out OUT go together")
    if opts.watch is not None and not opts.watch.is_dir():
        raise UsageError(f"{opts.watch}: --watch must be an existing folder")
    for root in opts.roots:
        if not root.is_dir():
            raise UsageError(f"{root}: --root must be an existing folder")
    token = read_token(opts.token_file) if opts.token_file else None
    with socket.socket(socket.AF_INET6 if ":" in opts.host else socket.AF_INET) as probe:
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((opts.host, opts.port))
        except OSError as e:
            raise UsageError(f"cannot listen on {opts.host}:{opts.port} ({e.strerror or e}); choose another --port "
                             "or --host") from None
    return token


SERVE_FIELDS: tuple[dataclasses.Field, ...] = dataclasses.fields(ServeOptions)


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
    roots = [*opts.roots, *([opts.watch, opts.out] if opts.watch else [])] or [Path.cwd()]
    if opts.out is not None:
        opts.out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        try:
            engines, setup, engine_info = _engines(options, opts, roots, stack)
            _serve(engines, setup, engine_info, opts, roots, token, log)
        except (KeyboardInterrupt, Terminated):     # uvicorn passes the signal on once it has stopped: a clean stop
            pass


def _engines(options: EngineOptions, opts: ServeOptions, roots: list[Path], stack: contextlib.ExitStack
             ) -> tuple[list, RenderSetup, dict[str, Any]]:
    """The warm engines (the in-process Renderer, or one per Ray actor, let go when `stack` closes), the setup jobs
    are checked with, and what the log and /healthz say of the engines."""
    from ditto_fast.engine.render_setup import RenderSetup

    t0 = time.perf_counter()
    if opts.ray is None:
        from ditto_fast.engine.renderer import Renderer

        engine = Renderer(setup=RenderSetup.resolve(options))
        return [engine], engine.setup, {"seconds": round(time.perf_counter() - t0, 2), "device": str(engine.device)}
    from ditto_fast.batch.ray_actors import ray_session
    from ditto_fast.serve.ray_pool import RayPool

    ray = stack.enter_context(ray_session(opts.ray))
    pool = RayPool(opts.ray, options, opts.workers)
    stack.callback(pool.close)
    engines = pool.start(ray, roots)
    return engines, pool.check_setup, {"seconds": round(time.perf_counter() - t0, 2), "ray": opts.ray,
                                       "actors": pool.describe()}


def _serve(engines: list, setup: RenderSetup, engine_info: dict[str, Any], opts: ServeOptions, roots: list[Path],
           token: str | None, log: Callable[[dict], None]) -> None:
    import uvicorn

    from ditto_fast.serve.accept import Acceptor
    from ditto_fast.serve.api import make_app
    from ditto_fast.serve.metrics import Metrics
    from ditto_fast.serve.queue import JobQueue
    from ditto_fast.serve.watch import WatchFolder
    from ditto_fast.serve.worker import Worker

    queue = JobQueue(store_root() / "serve" / "jobs.sqlite")
    log({"event": "engine loaded", **engine_info, "queued": queue.counts()["queued"]})
    metrics = Metrics(queue)
    acceptor = Acceptor(queue, setup, roots, avatars=engines[0].avatar)    # the engines' avatars, opened once
    worker = Worker(engines, queue, metrics, log, audio=acceptor.decoded)
    watch = WatchFolder(opts.watch, opts.out, opts.defaults, acceptor, queue, worker.notify, log, opts.settle_s,
                        opts.poll_s) if opts.watch else None
    app = make_app(queue, acceptor, worker, metrics, token, engine_info)
    server = uvicorn.Server(uvicorn.Config(app, host=opts.host, port=opts.port, log_level="warning",
                                           access_log=False, lifespan="off"))
    worker.start()
    if watch:
        watch.start()
    log({"event": "listening", "url": f"http://{opts.host}:{opts.port}", "roots": [str(r) for r in roots],
         "watch": str(opts.watch) if opts.watch else None})
    try:
        server.run()
    finally:
        if watch:
            watch.stop()
        worker.stop()
        log({"event": "stopped", "queued": queue.counts()["queued"]})
