"""The commands (register, render, batch, serve, live, qc, config, avatars, checkpoints, doctor): each parses its
options, calls the layer below and prints; main() maps error classes to exit codes."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import click

from ditto_fast.console.options import (CONFIG, ENGINE, PATH, QUIET, engine_options, field_options, progress_bar,
                                       request_options, setting_option, take, take_engine_options)
from ditto_fast.console.process import end_process, on_sigterm
from ditto_fast.console.process import exit_now as _exit_now       # tests replace it: an interrupt ends no test run
from ditto_fast.core.errors import (EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_SOME_FAILED, EXIT_TERMINATED, DittoError,
                                    Terminated, one_line)
from ditto_fast.core.version import __version__
from ditto_fast.engine.request import FIELDS, JOB_KEYS, RenderRequest
from ditto_fast.live.options import LIVE_FIELDS, LIVE_REQUEST_FIELDS, LiveOptions, LiveRequest
from ditto_fast.serve.options import SERVE_FIELDS, ServeOptions


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: run the CLI, turn known failures into one stderr line and an exit code."""
    os.environ.setdefault("GLOG_minloglevel", "2")       # quiet mediapipe's C++ logging
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        cli.main(args=argv, prog_name="ditto-fast", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("ditto-fast: interrupted", err=True)
        _exit_now(EXIT_INTERRUPTED)
    except click.exceptions.NoArgsIsHelpError as e:      # a bare group (`ditto-fast`): its help, as asked
        e.show()
        sys.exit(e.exit_code)
    except click.ClickException as e:
        click.echo(f"ditto-fast: error: {click_error_line(e)}", err=True)
        sys.exit(e.exit_code)
    except DittoError as e:
        click.echo(f"ditto-fast: error: {e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("ditto-fast: interrupted", err=True)
        _exit_now(EXIT_INTERRUPTED)
    except Terminated:
        click.echo("ditto-fast: terminated", err=True)
        _exit_now(EXIT_TERMINATED)
    except Exception as e:  # noqa: BLE001 - a bug: one line, traceback on request
        if os.environ.get("DITTO_FAST_DEBUG"):
            raise
        import traceback

        where = traceback.extract_tb(e.__traceback__)[-1]
        click.echo(f"ditto-fast: internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                   f"(at {Path(where.filename).name}:{where.lineno}); rerun with DITTO_FAST_DEBUG=1 for the "
                   "traceback and report it", err=True)
        sys.exit(EXIT_INTERNAL)


def click_error_line(e: click.ClickException) -> str:
    """A usage error click found (a bad option value, a missing option, an unknown command) as the one line every
    other error is, naming the command whose --help says more: "--seed: must be in ...; see `ditto-fast render
    --help`"."""
    ctx, param = getattr(e, "ctx", None), getattr(e, "param", None)
    message = e.format_message()
    if type(e) is click.BadParameter and param is not None:          # "Invalid value for '--seed': ..."
        name = "/".join(param.opts) if isinstance(param, click.Option) else param.human_readable_name
        message = f"{name}: {e.message}"
    message = one_line(message.strip().rstrip("."))
    return f"{message}; see `{ctx.command_path} --help`" if ctx is not None else message


def entry() -> None:
    """The `ditto-fast` command: main(), then exit without the interpreter's teardown (see console/process.py)."""
    end_process(main)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__)      # the package's own attribute: no look-up of installed distributions
def cli() -> None:
    """ditto-fast: lip-synced talking-anchor videos from a registered avatar and a speech file."""


# ----------------------------------------------------------------------------- register
@cli.command()
@click.argument("source", type=PATH)
@click.option("--name", help="Avatar name [A-Za-z0-9_-]{1,64}; default: the file stem.")
@setting_option("--max-size", setting=("register", "max_size"),
                help="Long side of the frames kept; larger sources are resized.")
@click.option("--max-frames", type=click.IntRange(1), default=None, help="Use at most N frames.")
@click.option("--force", is_flag=True, help="Replace an existing avatar of that name.")
@ENGINE["checkpoints"]
@ENGINE["device"]
@setting_option("--batch-size", setting=("register", "batch_size"), help="Crops per batch.")
@QUIET
@click.option("--strict", is_flag=True, help="Refuse (exit 4) a source whose mouth is open, instead of a warning.")
@setting_option("--source-colour", setting=("register", "source_colour"),
                help="The colour matrix of the video's pixels: auto (its tag; untagged BT.709 from 1280x720 up, "
                     "BT.601 below), bt601 or bt709 (whatever its tag says).")
@setting_option("--face", setting=("register", "face"), metavar="largest|left|right|N",
                help="The face to animate when the source shows several: the largest, the leftmost, the rightmost, "
                     "or the Nth from the left (1 = leftmost); a note names the one taken.")
@CONFIG
def register(source, name, max_size, max_frames, force, checkpoints, device, batch_size, quiet, strict,
             source_colour, face, config_path):
    """Register SOURCE (video or image) as an avatar: crops, features and plate cached for fast renders."""
    from ditto_fast.avatar.register import Registrar
    from ditto_fast.core.config import load_config
    from ditto_fast.core.memory import reuse_freed_memory

    config = load_config(config_path).register
    reuse_freed_memory()          # registration also returns the free pages every TRIM_EVERY frames
    registrar = Registrar(checkpoints, device, config)
    with progress_bar("register", quiet) as report:
        from ditto_fast.engine.progress import counted

        avatar_dir = registrar.register(source, name, max_size=max_size, max_frames=max_frames, force=force,
                                        batch_size=batch_size, progress=counted(report) if report else None,
                                        strict=strict, source_colour=source_colour, face=face)
    for note in registrar.notes:
        click.echo(f"ditto-fast: note: {note}", err=True)
    for warning in registrar.warnings:
        click.echo(f"ditto-fast: warning: {warning}", err=True)
    click.echo(str(avatar_dir))


# ----------------------------------------------------------------------------- render
@cli.command()
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

    with progress_bar("render", quiet) as bar:
        result = render_one(request, options, timings=timings, preview=preview, reads=[config_path], progress=bar,
                            note=lambda text: click.echo(f"ditto-fast: note: {text}", err=True))
    for warning in result.warnings:
        click.echo(f"ditto-fast: warning: {warning}", err=True)
    if not quiet:
        click.echo(stage_table(result.timings), err=True)
    click.echo(str(result.output))


# ----------------------------------------------------------------------------- batch
@cli.command(help=f"Render many clips with one engine: JOBS_FILE (JSON lines: avatar, audio, output, and optional "
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


# ----------------------------------------------------------------------------- serve
@cli.command()
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


# ----------------------------------------------------------------------------- live
@cli.command()
@field_options(LIVE_FIELDS)
@field_options(LIVE_REQUEST_FIELDS)
@engine_options
@click.option("--stop-at-end", is_flag=True,
              help="End the stream once the source ends and its frames are out (rehearsal, tests); otherwise it runs "
                   "until Ctrl-C or SIGTERM, which end it cleanly.")
@QUIET
@CONFIG
def live(stop_at_end, quiet, config_path, **values):
    """Stream AVATAR speaking what --audio-in brings, as it arrives, to --out: idle motion when nobody speaks, frames
    at the nominal rate by the wall clock, picture and the same audio in one stream. Exit 0 when ended by the
    source's end (--stop-at-end), Ctrl-C or SIGTERM."""
    options = LiveOptions(**take(values, LIVE_FIELDS))
    request = LiveRequest(**take(values, LIVE_REQUEST_FIELDS))
    if request.out is None:
        raise click.UsageError("Missing option '--out'.")
    engine = take_engine_options(values, config_path)
    from ditto_fast.live.start import run_live
    from ditto_fast.live.stats import LiveStats

    say = (lambda line: None) if quiet else (lambda line: click.echo(line, err=True))
    stats = run_live(request, options, engine, stop_at_end, say)
    click.echo(LiveStats.line(stats), err=True)


# ----------------------------------------------------------------------------- qc
@cli.command("qc")
@click.argument("file", type=PATH)
@click.option("--delivery", metavar="NAME|FILE",
              help="The delivery profile to check against: a name from configs/delivery or a FILE.yaml. "
                   "Default: of the shipped profiles for the file's container and codec, and what render writes "
                   "in them without --delivery, the one it comes closest to.")
@click.option("--loudness", metavar="off|LUFS",
              help="As render's: the loudness target the file was leveled to instead of the profile's, or off "
                   "(levels as spoken: loudness and true peak are measured and noted, not failed).")
@click.option("--timecode", metavar="HH:MM:SS:FF", help="As render's: the start timecode instead of the profile's.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def qc_cmd(file, delivery, loudness, timecode, as_json):
    """Check FILE (any video file) against a delivery profile, one line per requirement: ok or FAIL with the
    measured value (note: not met, waived by --loudness off). Exit 8 when some requirement fails. The same check
    render and batch --delivery run on their file before it is renamed into place."""
    from ditto_fast.core.errors import QCError
    from ditto_fast.engine.request import check_field

    loudness, timecode = check_field("loudness", loudness), check_field("timecode", timecode)
    from ditto_fast.delivery import qc
    from ditto_fast.delivery.profiles import load_profile

    if delivery:
        profile = load_profile(delivery)
        requirements = qc.check_file(file, profile, timecode=timecode,
                                     loudness=qc.loudness_wanted(profile, loudness))
    else:
        if loudness is not None or timecode is not None:
            raise click.UsageError("--loudness and --timecode go with --delivery; name the profile")
        profile, requirements, among = qc.closest_profile(file)
        click.echo(f"ditto-fast: note: {file}: checked against {profile.name}, the closest of "
                   f"{', '.join(among)} (name another with --delivery)", err=True)
    bad = qc.failures(requirements)
    if as_json:
        click.echo(json.dumps({"file": str(file), "profile": profile.name, "ok": not bad,
                               "requirements": qc.as_json(requirements)}, indent=2))
    else:
        for r in requirements:
            click.echo(r.line())
    if bad:
        click.echo(f"ditto-fast: {file}: {len(bad)} of {len(requirements)} requirements of {profile.name} fail",
                   err=True)
        sys.exit(QCError.exit_code)


# ----------------------------------------------------------------------------- config
@cli.command("config")
@CONFIG
def config_cmd(config_path):
    """Print the settings in effect (the defaults, or with --config FILE that file's overrides), as YAML."""
    import dataclasses

    import yaml

    from ditto_fast.core.config import load_config

    click.echo(yaml.safe_dump(dataclasses.asdict(load_config(config_path)), sort_keys=False).rstrip())


# ----------------------------------------------------------------------------- avatars
@cli.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def avatars(ctx, as_json):
    """List registered avatars (subcommands: show, rm)."""
    if ctx.invoked_subcommand is not None:
        return
    from ditto_fast.avatar import list_avatars, store_root

    rows = list_avatars()
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    if not rows:
        click.echo(f"no avatars in {store_root() / 'avatars'}; create one with `ditto-fast register SOURCE`")
        return
    click.echo(f"{'name':<20} {'frames':>6} {'size':>10} {'disk':>9}  {'created':<20} checkpoints")
    for r in rows:
        if r.get("error"):
            click.echo(f"{r['name']:<20} damaged: {r['error']}")
            continue
        mb = r.get("size_bytes", 0) / 2**20
        flag = " (random weights)" if r.get("random_weights") else ""
        click.echo(f"{r['name']:<20} {r['frames']:>6} {r['resolution']:>10} {mb:>7.1f}MB  "
                   f"{str(r.get('created', ''))[:19]:<20} {r.get('checkpoints', '')}{flag}")


@avatars.command("show")
@click.argument("name")
@click.option("--verify", is_flag=True, help="Check the full checksums of the cached files.")
@click.option("--preview", type=PATH, default=None,
              help="Also write a PNG: source frames with crop box and landmarks, the crops, pose/eye/mouth plots.")
def avatars_show(name, verify, preview):
    """Show one avatar's details."""
    from ditto_fast.avatar import avatar_info, load_avatar

    if preview is not None:
        from ditto_fast.preview.paths import check_png_path

        check_png_path(preview)
        from ditto_fast.avatar.store import avatars_dir
        from ditto_fast.media.outputs import check_writes

        check_writes([("preview", preview)], [avatars_dir() / name])
    info = avatar_info(name, verify=verify)
    if preview is not None:
        from ditto_fast.preview.avatar_sheet import write_avatar_preview

        info["preview"] = str(write_avatar_preview(load_avatar(name, verify="light"), preview))
    click.echo(json.dumps(info, indent=2, default=str))


@avatars.command("rm")
@click.argument("name")
def avatars_rm(name):
    """Remove an avatar from the store."""
    from ditto_fast.avatar import remove_avatar

    remove_avatar(name)
    click.echo(f"removed {name}")


# ----------------------------------------------------------------------------- checkpoints
@cli.group()
def checkpoints():
    """Inspect checkpoints or write random ones in the published layout."""


@checkpoints.command("init-random")
@click.argument("directory", type=PATH)
@click.option("--tiny", is_flag=True, help="Tiny widths of the same architectures (fast CPU tests).")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True)
def checkpoints_init_random(directory, tiny, seed):
    """Write random weights for all six networks, HuBERT and the speech-emotion classifier into DIRECTORY (outputs
    are labelled random)."""
    from ditto_fast.checkpoints.random_weights import write_random

    root = write_random(directory, tiny=tiny, seed=seed)
    click.echo(f"wrote {'tiny ' if tiny else ''}random checkpoints (seed {seed}) to {root}")


@checkpoints.command("info")
@ENGINE["checkpoints"]
def checkpoints_info(checkpoints):
    """Load every network once and print its file, fingerprint and size."""
    from ditto_fast.checkpoints import find_checkpoints
    from ditto_fast.models import load

    cs = find_checkpoints(checkpoints)
    prints = cs.fingerprints()
    for name, path in cs.files.items():
        net = load(name, path)
        n = sum(p.numel() for p in net.parameters())
        click.echo(f"{name:<22} {prints[name]}  {n / 1e6:8.2f}M params  {path}")
    click.echo(f"{'hubert':<22} {prints['hubert']}  {cs.hubert_dir}")
    if cs.has_emotion():
        click.echo(f"{'speech-emotion':<22} {cs.emotion_fingerprint()}  {cs.emotion_dir}")
    else:
        click.echo(f"{'speech-emotion':<22} {'(none)':<16}  {cs.emotion_dir} not found: optional, --emotion auto "
                   "needs it")
    if cs.random_weights:
        click.echo("these are RANDOM weights (ditto-fast checkpoints init-random): outputs are noise")


# ----------------------------------------------------------------------------- doctor
@cli.command()
@ENGINE["checkpoints"]
def doctor(checkpoints):
    """Check ffmpeg, torch device, mediapipe models, checkpoints (each loaded) and the avatar store, one line each;
    changes nothing. Exit 6 if the checkpoints fail, 3 if the store is not writable."""
    from ditto_fast.doctor import run_checks

    failed = []
    for check in run_checks(checkpoints):
        failed += [] if check.ok else [check.exit_code]
        click.echo(f"[{'ok' if check.ok else 'FAIL'}] {check.name:<12} {check.detail}")
    # 6 for the checkpoints, 3 for the store (a broken install, ffmpeg or torch say, leaves 1)
    sys.exit(next((c for c in failed if c != EXIT_INTERNAL), failed[0]) if failed else 0)


if __name__ == "__main__":  # pragma: no cover
    entry()
