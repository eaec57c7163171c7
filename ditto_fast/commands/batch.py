"""`ditto-fast batch`: many clips with one engine (or Ray actors), from a jobs file or a folder of audio."""

from __future__ import annotations

import sys

import click

from ditto_fast.console.options import (CONFIG, PATH, QUIET, engine_options, progress_bar, request_options,
                                       take_engine_options)
from ditto_fast.core.errors import EXIT_SOME_FAILED, one_line
from ditto_fast.engine.request import JOB_KEYS


@click.command(help=f"Render many clips with one engine: JOBS_FILE (JSON lines: avatar, audio, output, and optional "
                    f"{', '.join(k for k in JOB_KEYS if k not in ('avatar', 'audio', 'output'))}) or --avatar NAME "
                    f"--audio-dir IN --out-dir OUT. Exit {EXIT_SOME_FAILED} if any job failed.")
@click.argument("jobs_file", required=False, type=PATH)
@click.option("--avatar", help="With --audio-dir: the avatar for every job.")
@click.option("--audio-dir", type=PATH, help="One job per audio file in this folder.")
@click.option("--out-dir", type=PATH,
              help="With --audio-dir: where <stem>.mp4 go (<stem>.mov with --codec prores, the profile's extension "
                   "with --delivery).")
@click.option("--report", type=PATH, default=None,
              help="Write every job's outcome here as JSON (rewritten after each job).")
@click.option("--force", is_flag=True, help="Render again jobs whose output was made from the same inputs.")
@click.option("--fail-fast", is_flag=True, help="Stop rendering after the first failed job.")
@click.option("--previews", "previews_dir", type=PATH, default=None,
              help="Write a preview PNG of each rendered job into this folder (<output stem>.png); "
                   "the report gives each job's \"preview\".")
@request_options(skip=("avatar", "audio", "output"), job_default=True)
@engine_options
@QUIET
@click.option("--ray", "ray_address", default=None, metavar="local|ADDRESS",
              help="Render on Ray actors: 'local' starts Ray here, ADDRESS joins a cluster (pip extra [ray]).")
@click.option("--workers", type=click.IntRange(1, 1024), default=None,
              help="With --ray: at most N actors [default: one per GPU, or per node without GPUs].")
@CONFIG
def batch(jobs_file, avatar, audio_dir, out_dir, report, force, fail_fast, previews_dir, quiet, ray_address, workers,
          config_path, **values):
    from ditto_fast.batch.jobs import summary
    from ditto_fast.batch.launch import collect_jobs, launch

    by_dir = (avatar, audio_dir, out_dir)
    if jobs_file is not None and any(v is not None for v in by_dir):
        raise click.UsageError("give either JOBS_FILE or --avatar/--audio-dir/--out-dir, not both")
    if jobs_file is None and any(v is None for v in by_dir):
        raise click.UsageError("give JOBS_FILE, or all of --avatar NAME --audio-dir IN --out-dir OUT")
    options = take_engine_options(values, config_path)
    jobs = collect_jobs(jobs_file, avatar, audio_dir, out_dir, values)
    if workers is not None and ray_address is None:
        raise click.UsageError("--workers goes with --ray")
    if previews_dir is not None and ray_address is not None:
        raise click.UsageError("--previews does not work with --ray yet; render previews with `render --preview`")
    with progress_bar("batch", quiet) as bar:
        launch(jobs, options, ray=ray_address, workers=workers, force=force, fail_fast=fail_fast, report=report,
               previews=previews_dir, reads=[jobs_file, config_path], progress=bar,
               warn=lambda text: click.echo(f"ditto-fast: warning: {one_line(text)}", err=True))
    for j in jobs:
        for note in j.extra.get("notes", []):
            click.echo(f"ditto-fast: note: job {j.index}: {note}", err=True)
    if not quiet:
        click.echo(f"{'job':>4}  {'status':<8}{'frames':>7}{'seconds':>9}  output / error", err=True)
        for j in jobs:
            click.echo(f"{j.index:>4}  {j.status:<8}{j.frames:>7}{j.seconds:>9.1f}  "
                       f"{one_line(str(j.error if j.status == 'failed' else j.output))}", err=True)
    counts = summary(jobs)
    click.echo(", ".join(f"{k} {v}" for k, v in counts.items()))
    failed = [j for j in jobs if j.status == "failed"]
    if failed and quiet:           # no table: the first failure in one line (the report has them all)
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        click.echo(f"ditto-fast: error: job {failed[0].index} failed{more}: {one_line(str(failed[0].error))} "
                   f"(exit {failed[0].exit_code})", err=True)
    if failed:
        sys.exit(EXIT_SOME_FAILED)
