"""`ditto-fast live` below the command line: check everything a user gives before any network loads, then load the
engine, open the avatar, the source and the stream, and run the session. `serve`'s live sessions use the same two
halves: the checks in the server, the stream in an engine process of the engine host (ditto_fast/handles/)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

from ditto_fast.core.config import Config
from ditto_fast.core.errors import InputError, UsageError
from ditto_fast.encoding.writer import check_output_path
from ditto_fast.engine.options import EngineOptions
from ditto_fast.live.options import LiveOptions, LiveRequest
from ditto_fast.live.outputs import (StreamOutput, check_destination, check_reachable, stream_files,
                                     written_by_stream)
from ditto_fast.live.sources import check_source_url, open_source, source_file
from ditto_fast.media.outputs import check_writes, write_json
from ditto_fast.media.rates import STREAM_SAMPLE_RATE

# how each door tells the fix: `live`'s flags, POST /v1/live's fields
COMMAND = {"force": "give --force", "out": "--out"}
SERVED = {"force": 'send "overwrite": true', "out": "out"}
STREAM_SUFFIXES = (".ts", ".m3u8")
ENCODERS = {("h264", False): "libx264", ("hevc", False): "libx265", ("h264", True): "h264_nvenc",
            ("hevc", True): "hevc_nvenc"}


COMPILE_REFUSED = ("live sessions run on engines launched eager or with graphs: torch.compile's CUDA graphs are kept "
                   "per thread (pytorch/pytorch#123177) and each session would compile anew, minutes into its stream; "
                   "use --launch graphs")


def check_launch(launch: str) -> None:
    """A live session on an engine launched as `launch` (the engine option): UsageError for compile."""
    if launch == "compile":
        raise UsageError(COMPILE_REFUSED)


def check_live(request: LiveRequest, config: Config, stats: Path | None = None, source: Path | None = None,
               served: bool = False) -> None:
    """Everything about a session that can be checked before anything loads: its settings (a control file read, a
    codec a stream can take) and the files it writes (check_files); UsageError or InputError naming what is wrong."""
    request.settings(config)
    check_files(request, stats, source, served)


def check_files(request: LiveRequest, stats: Path | None = None, source: Path | None = None,
                served: bool = False) -> None:
    """The one set of rules for the files a session writes, `live`'s and POST /v1/live's (`served`: the fix is then
    told as the API says it): its destination (a file's folder writable: InputError; a URL complete), never the
    `source` file it reads, and `stats` (its figures) none of those nor a stream's file; a .ts, playlist, segment
    or stats file there already is replaced only with `request.overwrite` (--force, "overwrite": true). UsageError
    (exit 2) naming the file and the fix."""
    words = SERVED if served else COMMAND
    replace = bool(request.overwrite)
    if request.out is not None:
        check_destination(request.out)
        if source is not None and written_by_stream(request.out, source):
            raise UsageError(f"{request.out}: the stream would overwrite its own source ({source}); choose another "
                             f"{words['out']}")
        there = [p for p in stream_files(request.out) if p.is_file()]
        if there and not replace:
            more = f" and {len(there) - 1} more of its files" if len(there) > 1 else ""
            raise UsageError(f"{there[0]}{more}: exists; a stream starts its file anew: {words['force']} to replace "
                             f"it, or choose another {words['out']}")
    if stats is None:
        return
    check_output_path(stats, example="live.json")
    check_writes([("stats file (--stats)", stats)], [source])
    if request.out is not None and written_by_stream(request.out, stats):
        raise UsageError(f"--stats {stats}: the stream (--out {request.out}) writes there; give the figures a file "
                         "of their own")
    if Path(stats).suffix.lower() in STREAM_SUFFIXES:       # another stream's playlist or segment, even with --force
        raise UsageError(f"--stats {stats}: the figures are JSON, and that is a stream's file name; give a name such "
                         f"as {Path(stats).with_suffix('.json')}")
    if Path(stats).is_file() and not replace:
        raise UsageError(f"--stats {stats}: exists; {words['force']} to replace it, or choose another --stats")


def run_live(request: LiveRequest, options: LiveOptions, engine: EngineOptions, stop_at_end: bool,
             log: Callable[[str], None], stdin_fd: int | None = None, *,
             load: Callable[[EngineOptions], Any]) -> dict:
    """Stream `request.avatar` speaking what `options.audio_in` brings to `request.out` until the source ends
    (`stop_at_end`), an interrupt or SIGTERM; returns the session's stats (also written to `options.stats`). Every
    file and destination is checked before the networks load (`load(engine)`: handles/local.py's load_renderer, the
    one place they load); a source that fails before any speech came ends the
    stream and leaves nothing behind (no stream file, no stats), and a source that failed at all is InputError (its
    line) once the stream is closed."""
    source_path = source_file(options.audio_in)
    config = engine.settings()
    check_launch(engine.launch or config.render.launch)
    check_live(request, config, options.stats, source_path)
    if request.out is not None:
        check_reachable(request.out)        # an RTMP server that takes no connection, an SRT/UDP host not known
    check_source_url(options.audio_in)                                  # an http(s) source that answers 404
    source = open_source(options.audio_in, stdin_fd=stdin_fd, stop_at_end=stop_at_end)   # checked: missing file ...
    try:
        renderer = load(engine)
    except BaseException:
        source.close()
        raise
    done = threading.Event()

    def stop_when_the_source_fails(session) -> None:
        """A source that fails before any speech came (refused bytes, a URL that cannot be read) ends the stream:
        there is nothing to stream but silence for ever."""
        def watch() -> None:
            while not done.wait(0.1):
                if source.ended and source.error and source.received == 0:
                    session.stop("source error")
                    return
        threading.Thread(target=watch, name="live-source-watch", daemon=True).start()

    try:
        stats = stream_live(renderer, request, source, stop_at_end, log, started=stop_when_the_source_fails)
    finally:
        done.set()
    if source.error and source.received == 0:       # refused before its first speech: nothing to keep, and
        for path in stream_files(request.out) if request.out is not None else []:   # nothing to block a rerun
            path.unlink(missing_ok=True)
        raise InputError(source.error)
    if options.stats is not None:
        write_json(options.stats, stats)
    if source.error:                        # the stream is closed and complete up to here; the source failed
        raise InputError(source.error)
    return stats


def stream_live(renderer, request: LiveRequest, source, stop_at_end: bool, log: Callable[[str], None],
                started: Callable[[Any], None] | None = None, output: Callable[[Any, Any], Any] | None = None,
                fused: Any = None, windows: Any = None) -> dict:
    """Run one session on a loaded `renderer` from `source` (not started) to `request.out` (checked by check_live);
    `started(session)` is called once it exists (to read its stats or stop it from another thread). `output(avatar,
    settings)`, if given, makes the stream's output instead (an object with StreamOutput's write/close/abort: an
    in-process consumer of the frames, such as the Pipecat service's). `fused`, `windows`: the warp + decode and the
    LMDM windows the session shares (LiveSession's)."""
    from ditto_fast.live.session import LiveSession

    try:
        avatar = renderer.avatar(request.avatar)
        settings = request.settings(renderer.config, avatar.rate, stop_at_end)
        output = output(avatar, settings) if output is not None else stream_output(renderer, request, avatar, settings)
    except BaseException:
        source.close()
        raise
    log(f"live: {avatar.name} to {request.out or 'the caller'} at {settings.rate} fps, "
        f"{avatar.size[0]}x{avatar.size[1]}, overlap {settings.overlap}, --max-latency {settings.max_latency:g} s"
        + (", RANDOM WEIGHTS: the face region is noise" if renderer.random_weights or avatar.random_weights else ""))
    try:
        session = LiveSession(renderer, avatar, source, output, settings, log, fused=fused, windows=windows)
        if started is not None:
            started(session)
        return session.run()
    except BaseException:
        source.close()
        output.abort()
        raise


def stream_output(renderer, request: LiveRequest, avatar, settings) -> StreamOutput:
    """The ffmpeg stream to `request.out` of a session of `avatar` (its size, its plate's pixel format). What it
    replaces (`request.overwrite`) goes first: a new playlist keeps no segment of the old one beside it."""
    if request.overwrite and request.out is not None:
        for path in stream_files(request.out):
            if path.is_file():
                path.unlink(missing_ok=True)
    return StreamOutput(request.out, avatar.size, settings.rate, plate_pix_fmt(avatar), crf=renderer.setup.crf,
                        preset=renderer.setup.preset, encoder=ENCODERS[settings.codec, renderer.setup.nvenc],
                        audio_sample_rate=STREAM_SAMPLE_RATE)


def plate_pix_fmt(avatar) -> str:
    """The pixel format of the avatar's plate planes (what the putback hands the encoder)."""
    from ditto_fast.avatar.plate import PlateReader

    with PlateReader(avatar.plate_source, avatar.n_frames, is_image=avatar.is_image, pix_fmt="planes") as plate:
        return plate.layout.pix_fmt
