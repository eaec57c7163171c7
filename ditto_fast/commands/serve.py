"""`ditto-fast serve`: one engine kept loaded behind the job API, the newsroom page and a watch folder."""

from __future__ import annotations

import click

from ditto_fast.console.options import (CONFIG, QUIET, engine_options, field_options, request_options, take,
                                       take_engine_options)
from ditto_fast.serve.options import SERVE_FIELDS, ServeOptions


@click.command()
@field_options(SERVE_FIELDS)
@request_options(skip=("audio", "output"), job_default=True)
@engine_options
@QUIET
@CONFIG
def serve(quiet, config_path, **values):
    """Keep one engine loaded and render jobs from a durable queue: an HTTP job API (POST /v1/jobs, GET
    /v1/jobs/ID, DELETE, /healthz, /metrics, /openapi.json), the newsroom page at / (uploads, previews, the queue)
    and an optional watch folder (it needs --avatar). One JSON log line per job state."""
    try:
        import fastapi  # noqa: F401
        import python_multipart  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise click.UsageError('serve needs the [serve] extra: pip install -e ".[serve]"') from None
    from ditto_fast.serve.server import serve as run_server

    options = take_engine_options(values, config_path)
    run_server(options, ServeOptions(**take(values, SERVE_FIELDS), defaults=values, quiet=quiet))
