"""`ditto-fast live` below the command line: check everything a user gives before any network loads, then load the
engine, open the avatar, the source and the stream, and run the session. `serve`'s live sessions use the same two
halves: the checks in the server, the stream in an engine process of the engine host (ditto_fast/handles/)."""

from __future__ import annotations

import threading
from typing import Any, Callable

from ditto_fast.core.config import Config
from ditto_fast.core.errors import InputError, UsageError
from ditto_fast.encoding.writer import check_output_path
from ditto_fast.engine.options import EngineOptions
from ditto_fast.live.options import LiveOptions, LiveRequest
from ditto_fast.live.outputs import (StreamOutput, check_destination, check_reachable, check_stream_replaces,
                                     written_by_stream)
from ditto_fast.live.sources import check_source_url, open_source, source_file
from ditto_fast.media.outputs import check_writes, write_json
from ditto_fast.media.rates import STREAM_SAMPLE_RATE

ENCODERS = {("h264", False): "libx264", ("hevc", False): "libx265", ("h264", True): "h264_nvenc",
            ("hevc", True): "hevc_nvenc"}


def check_live(request: LiveRequest, config: Config) -> None:
    """Everything about a session that can be checked before anything loads: its settings (a control file read, a
    codec a stream can take) and its destination (a file's folder writable, a URL complete); UsageError or
    InputError naming what is wrong."""
    request.settings(config)
    if request.out is not None:
        check_destination(request.out)


def run_live(request: LiveRequest, options: LiveOptions, engine: EngineOptions, stop_at_end: bool,
             log: Callable[[str], None], stdin_fd: int | None = None) -> dict:
    """Stream `request.avatar` speaking what `options.audio_in` brings to `request.out` until the source ends
    (`stop_at_end`), an interrupt or SIGTERM; returns the session's stats (also written to `options.stats`). Every
    file and destination is checked before the networks load; a source that fails before any speech came ends the
    stream, and a source that failed at all is InputError (its line) once the stream is closed."""
    check_live(request, engine.settings())
    source_path = source_file(options.audio_in)
    if request.out is not None:
        if source_path is not None and written_by_stream(request.out, source_path):
            raise UsageError(f"{request.out}: the stream would overwrite its own source ({source_path}); choose "
                             "another --out")
        check_stream_replaces(request.out, bool(options.force))
        check_reachable(request.out)        # an RTMP server that takes no connection, an SRT/UDP host not known
    if options.stats is not None:           # written at the end: checked now, not after the whole stream
        check_output_path(options.stats, example="live.json")
        check_writes([("stats file (--stats)", options.stats)], [source_path])
        if request.out is not None and written_by_stream(request.out, options.stats):
            raise UsageError(f"--stats {options.stats}: the stream (--out {request.out}) writes there; give the "
                             "figures a file of their own")
    check_source_url(options.audio_in)                                  # an http(s) source that answers 404
    source = open_source(options.audio_in, stdin_fd=stdin_fd, stop_at_end=stop_at_end)   # checked: missing file ...
    from ditto_fast.engine.renderer import Renderer

    try:
        renderer = Renderer(options=engine)
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
    """The ffmpeg stream to `request.out` of a session of `avatar` (its size, its plate's pixel format)."""
    return StreamOutput(request.out, avatar.size, settings.rate, plate_pix_fmt(avatar), crf=renderer.setup.crf,
                        preset=renderer.setup.preset, encoder=ENCODERS[settings.codec, renderer.setup.nvenc],
                        audio_sample_rate=STREAM_SAMPLE_RATE)


def plate_pix_fmt(avatar) -> str:
    """The pixel format of the avatar's plate planes (what the putback hands the encoder)."""
    from ditto_fast.avatar.plate import PlateReader

    with PlateReader(avatar.plate_source, avatar.n_frames, is_image=avatar.is_image, pix_fmt="planes") as plate:
        return plate.layout.pix_fmt
