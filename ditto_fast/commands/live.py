"""`ditto-fast live`: AVATAR speaking a stream of speech as it arrives, streamed out at the wall clock's pace."""

from __future__ import annotations

import click

from ditto_fast.console.options import CONFIG, QUIET, engine_options, field_options, take, take_engine_options
from ditto_fast.live.options import LIVE_FIELDS, LIVE_REQUEST_FIELDS, LiveOptions, LiveRequest


@click.command()
@field_options(LIVE_FIELDS)
@field_options(LIVE_REQUEST_FIELDS)
@engine_options
@click.option("--stop-at-end", is_flag=True,
              help="End the stream once the source ends and its frames are out (rehearsal, tests): a named pipe at its "
                   "first writer's close, a URL that stops sending (or stalls); otherwise it runs until Ctrl-C or "
                   "SIGTERM, which end it cleanly, and a named pipe waits for its next writer.")
@QUIET
@CONFIG
def live(stop_at_end, quiet, config_path, **values):
    """Stream AVATAR speaking what --audio-in brings, as it arrives, to --out: idle motion when nobody speaks, frames
    at the nominal rate by the wall clock, picture and the same audio in one stream. Exit 0 when ended by the
    source's end (--stop-at-end), Ctrl-C or SIGTERM; 3 when the source failed (bytes refused, a URL that answers
    404, cannot be reached or stalls), the stream closed complete up to there; one that failed or ended before its
    first speech (an empty stdin) leaves no file behind."""
    options = LiveOptions(**take(values, LIVE_FIELDS))
    request = LiveRequest(**take(values, LIVE_REQUEST_FIELDS))
    if request.out is None:
        raise click.UsageError("Missing option '--out'.")
    engine = take_engine_options(values, config_path)
    from ditto_fast.handles.local import load_renderer
    from ditto_fast.live.start import run_live
    from ditto_fast.live.stats import LiveStats

    say = (lambda line: None) if quiet else (lambda line: click.echo(line, err=True))
    stats = run_live(request, options, engine, stop_at_end, say, load=load_renderer)
    click.echo(LiveStats.line(stats), err=True)
