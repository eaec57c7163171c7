"""`ditto-fast render`: one clip, AUDIO spoken by AVATAR."""

from __future__ import annotations

import click

from ditto_fast.console.options import (CONFIG, PATH, QUIET, engine_options, progress_bar, request_options,
                                       take_engine_options)
from ditto_fast.engine.request import FIELDS, RenderRequest


@click.command()
@request_options()
@engine_options
@click.option("--timings", "timings", type=PATH, default=None,
              help="Write the stage timings as JSON.")
@click.option("--preview", type=PATH, default=None,
              help="Also write a PNG: thumbnails of the output, the waveform and the generated lip opening.")
@QUIET
@CONFIG
def render(timings, preview, quiet, config_path, **values):
    """Render AUDIO spoken by AVATAR into a video file (written to a temporary name, renamed when complete)."""
    request = RenderRequest(**{f.name: values.pop(f.name) for f in FIELDS})     # checked before torch loads
    options = take_engine_options(values, config_path)
    from ditto_fast.engine.renderer import stage_table
    from ditto_fast.engine.single import render_one
    from ditto_fast.handles.local import load_renderer

    with progress_bar("render", quiet) as bar:
        result = render_one(request, options, load=load_renderer, timings=timings, preview=preview, reads=[config_path], progress=bar,
                            note=lambda text: click.echo(f"ditto-fast: note: {text}", err=True))
    for warning in result.warnings:
        click.echo(f"ditto-fast: warning: {warning}", err=True)
    if not quiet:
        click.echo(stage_table(result.timings), err=True)
    click.echo(str(result.output))
