"""What `serve` is started with (the engine's options aside), declared once: the command's options are made from
these fields, and a ServeOptions made in Python is checked as the command line is. Light to import."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ditto_fast.core.declare import check_fields, declared
from ditto_fast.serve.hosts import check_allow_host

DEFAULT_PORT = 8750
MAX_CRASHES = 2                 # a job under which its engine (or server) died this many times is failed


@dataclass
class ServeOptions:
    """What `serve` was started with (engine options aside); the command's options are made from these fields."""

    host: str = declared("127.0.0.1", flags=("--host",),
                         help="Address to listen on; anything beyond this machine needs --token-file.")
    port: int = declared(DEFAULT_PORT, flags=("--port",), kind="int", range=(1, 65535))
    token_file: Path | None = declared(flags=("--token-file",), kind="path",
                                       help="A file holding the bearer token every API request must carry.")
    allow_host: list[str] = declared(flags=("--allow-host",), multiple=True, check=check_allow_host,
                                     help="A name the server also answers to, besides those it listens on "
                                          "(repeatable): the Host a reverse proxy passes on, or the name in the "
                                          "newsroom's address bar; NAME (any port) or NAME:PORT. A request naming "
                                          "another host is refused (421), and so is a page of another site that "
                                          "would change anything (403).")
    roots: list[Path] = declared(flags=("--root",), kind="path", multiple=True,
                                 help="A folder the jobs' files may lie in (repeatable; the watch folders count) "
                                      "[default: the current folder].")
    watch: Path | None = declared(flags=("--watch",), kind="path",
                                  help="A watch folder: each speech file dropped in it becomes a job once it stops "
                                       "growing.")
    out: Path | None = declared(flags=("--out",), kind="path", help="With --watch: where the outputs go.")
    settle_s: float = declared(5.0, flags=("--settle",), kind="float", range=(0.5, 600),
                               help="Seconds a dropped file's size and time must stay the same before it is taken.")
    poll_s: float = declared(2.0, flags=("--poll",), kind="float", range=(0.1, 60),
                             help="Seconds between looks at the watch folder.")
    ray: str | None = declared(flags=("--ray",),
                               help="Render on Ray actors, one engine each (one per GPU, or per node without GPUs): "
                                    "'local' starts Ray here, ADDRESS joins a cluster (pip extra [ray]); the queue "
                                    "and the API stay in this process.")
    workers: int | None = declared(flags=("--workers",), kind="int", range=(1, 1024),
                                   help="With --ray: at most N actors [default: one per GPU, or per node without "
                                        "GPUs].")
    max_crashes: int = declared(MAX_CRASHES, flags=("--max-crashes",), kind="int", range=(1, 100),
                                help="A job whose engine (or the server) dies under it this many times is failed, "
                                     "not run again.")
    callback_allow: list[str] = declared(flags=("--callback-allow",), multiple=True,
                                         help="An address or CIDR a job's callback may go to although it is "
                                              "private, loopback or link-local (repeatable; e.g. 10.20.0.0/16).")
    job_timeout: float | None = declared(flags=("--job-timeout",), kind="float", range=(1, 7 * 86400),
                                         help="Seconds a job may render: past them its engine is stopped (a "
                                              "fresh one starts) and the job fails once, exit 3, naming this "
                                              "limit; it is not run again [default: no limit].")
    stall_timeout: float = declared(900.0, flags=("--stall-timeout",), kind="float", range=(5, 86400),
                                    help="Seconds an engine may render (or a live session stream) without progress "
                                         "before it is taken for hung and killed.")
    heartbeat_timeout: float = declared(60.0, flags=("--heartbeat-timeout",), kind="float", range=(2, 3600),
                                        help="Seconds an engine may go without its heartbeat (its process stopped, "
                                             "or hung in native code) before it is taken for hung and killed; its "
                                             "job runs again, its live sessions end with the hang as their cause.")
    engine_memory: float | None = declared(flags=("--engine-memory",), kind="float", range=(0.5, 4096),
                                           help="GiB of address space each engine process may use: past it, the job "
                                                "fails as out of memory and a fresh engine starts, instead of the "
                                                "host's OOM killer choosing a process [default: no cap; not with "
                                                "--ray].")
    max_live: int = declared(1, flags=("--max-live",), kind="int", range=(0, 64),
                             help="Live sessions (POST /v1/live) that may stream at once, carried by the engines "
                                  "beside their render jobs, on the networks they have loaded; 0: none.")
    live_idle_timeout: float = declared(30.0, flags=("--live-idle-timeout",), kind="float", range=(1, 86400),
                                        help="Seconds a live session goes on with no client on its audio WebSocket "
                                             "(idle motion) before it ends.")
    live_outputs: str = declared("files", flags=("--live-outputs",), choices=("files", "any"),
                                 help="Where live sessions may stream: files (a .ts or .m3u8 under the roots) or "
                                      "any (also srt://, udp:// and rtmp:// URLs).")
    uploads: Path | None = declared(flags=("--uploads",), kind="path",
                                    help="Where the newsroom page's uploads (POST /v1/uploads) are stored; inside "
                                         "the roots [default: uploads/ in the first --root, else in --out].")
    max_upload_mb: int = declared(500, flags=("--max-upload-mb",), kind="int", range=(1, 100_000),
                                  help="The largest upload (POST /v1/uploads) taken, in MB; larger ones are refused "
                                       "(413) and nothing of them is kept.")
    defaults: dict[str, Any] = field(default_factory=dict)     # a watch folder's request fields
    quiet: bool = False

    def __post_init__(self) -> None:
        """Every option checked (UsageError naming it); the defaults as a job line would give them: unset ones left
        out, paths absolute."""
        check_fields(self)
        self.defaults = {k: (str(v.absolute()) if isinstance(v, Path) else v) for k, v in self.defaults.items()
                         if v is not None}


SERVE_FIELDS: tuple[dataclasses.Field, ...] = dataclasses.fields(ServeOptions)
