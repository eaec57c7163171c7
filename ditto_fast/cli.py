"""Click entry point: register, render, avatars, checkpoints, doctor. Maps error classes to exit codes."""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path

import click

from ditto_fast.core.config import check_setting, declaration, default
from ditto_fast.engine.request import FIELDS
from ditto_fast.core.errors import DittoError, Terminated, one_line

DEVICE = click.Choice(["auto", "cpu", "cuda"])


class DeclaredSetting(click.ParamType):
    """An option checked by its config declaration (`section.key`): the same values refused with the same message
    as in a job line, a config file or a RenderRequest made in Python."""

    def __init__(self, section: str, key: str):
        self.section, self.key = section, key
        self.decl = declaration(section, key)
        self.name = "|".join(self.decl["choices"]) if self.decl["choices"] else \
            "INTEGER" if self.decl["kind"] is int else "TEXT"

    def get_metavar(self, param, ctx=None) -> str:
        return f"[{self.name}]" if self.decl["choices"] else self.name

    def convert(self, value, param, ctx):
        if self.decl["kind"] is int and isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                pass                            # refused below, with the setting's own message
        try:
            return check_setting(self.section, self.key, value, "")
        except DittoError as e:                 # the setting's UsageError; click names the option
            self.fail(str(e).strip(), param, ctx)


class BatchSize(click.ParamType):
    """--batch-size: a whole number of frames in render.batch_size's range, or auto (1 on a CPU, the probe's batch
    on a GPU)."""

    name = "N|auto"

    def get_metavar(self, param, ctx=None) -> str:
        return self.name

    def convert(self, value, param, ctx):
        try:
            number = value if value == "auto" else int(value)
        except ValueError:
            number = value                      # refused below, with the setting's own message
        return DeclaredSetting("render", "batch_size").convert(number, param, ctx)


CONFIG = click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
                      help="YAML overriding some settings (`ditto-fast config` prints them all).")


def _default(section: str, key: str) -> str:
    """' [default: VALUE]' for a help text, read from the packaged settings."""
    return f" [default: {default(section, key)}; config {section}.{key}]"


def _range(section: str, key: str) -> str:
    """'LOW..HIGH' of a declared setting, for a help text."""
    decl = declaration(section, key)
    return f"{decl['low']}..{decl['high']}"


def _on_sigterm(signum, frame):  # pragma: no cover - exercised via subprocess tests
    raise Terminated()


def _exit_now(code: int) -> None:
    """Exit with `code` at once after an interrupt (cleanup already ran in the stages' context managers).

    A plain sys.exit can be turned into death-by-SIGINT when the interrupt also surfaced inside a
    finalizer during shutdown; scripts rely on the documented 130/143.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: run the CLI, turn known failures into one stderr line and an exit code."""
    os.environ.setdefault("GLOG_minloglevel", "2")       # quiet mediapipe's C++ logging
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        cli.main(args=argv, prog_name="ditto-fast", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("ditto-fast: interrupted", err=True)
        _exit_now(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except DittoError as e:
        click.echo(f"ditto-fast: error: {e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("ditto-fast: interrupted", err=True)
        _exit_now(130)
    except Terminated:
        click.echo("ditto-fast: terminated", err=True)
        _exit_now(143)
    except Exception as e:  # noqa: BLE001 - a bug: one line, traceback on request
        if os.environ.get("DITTO_FAST_DEBUG"):
            raise
        where = traceback.extract_tb(e.__traceback__)[-1]
        click.echo(f"ditto-fast: internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                   f"(at {Path(where.filename).name}:{where.lineno}); rerun with DITTO_FAST_DEBUG=1 for the "
                   "traceback and report it", err=True)
        sys.exit(1)


def entry() -> None:
    """The `ditto-fast` command: main(), then exit without the interpreter's teardown.

    By then every output is complete and renamed, and every child process waited for, so there is nothing
    left to do but free what torch and transformers imported: about 0.7 s a process, skipped. Ray keeps the
    normal exit: its exit hook stops the cluster it started.
    """
    try:
        main()
        code = 0
    except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
            code = e.code or 0
        else:
            click.echo(e.code, err=True)
            code = 1
    except KeyboardInterrupt:       # one that arrived after main() had mapped its own
        code = 130
    except Terminated:
        code = 143
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):   # a reader gone (| head) or no stream at all (>&-)
            pass
    if "ray" in sys.modules:
        sys.exit(code)
    os._exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ditto-fast")
def cli() -> None:
    """ditto-fast: lip-synced talking-anchor videos from a registered avatar and a speech file."""


def engine_options(command):
    """The engine's options, shared by render and batch: device, precision, batch size, encoder, checkpoints."""
    options = [
        click.option("--device", type=DEVICE, default="auto", show_default=True),
        click.option("--precision", type=click.Choice(["auto", "fp16", "bf16", "fp32"]), default="auto",
                     show_default=True),
        click.option("--batch-size", type=BatchSize(), default=None,
                     help=f"Frames per warp+decode micro-batch: {_range('render', 'batch_size')}, or auto (1 on a "
                          "CPU; on a GPU the fastest "
                          "per frame, measured once and kept in the store)." + _default("render", "batch_size")),
        click.option("--crf", type=DeclaredSetting("render", "crf"), default=None,
                     help="H.264 quality." + _default("render", "crf")),
        click.option("--preset", type=DeclaredSetting("render", "preset"), default=None,
                     help="x264 preset." + _default("render", "preset")),
        click.option("--encoder", type=click.Choice(["auto", "software", "nvenc"]), default="auto", show_default=True,
                     help="H.264/HEVC encoder: software (x264/x265), nvenc (the GPU's), or auto (NVENC when "
                          "rendering on CUDA and it works)."),
        click.option("--checkpoints", "checkpoints_dir", type=click.Path(path_type=Path), default=None),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def request_options(skip: tuple[str, ...] = (), job_default: bool = False):
    """The render request's fields as click options (their names, types, ranges and help from the request and the
    config's declarations), leaving out `skip`; with `job_default` each one is the default of a batch's jobs."""
    def decorate(command):
        for f in reversed(FIELDS):
            if f.name in skip:
                continue
            meta = f.metadata
            kind = DeclaredSetting(*meta["setting"]) if meta["setting"] else \
                click.Path(path_type=Path) if meta["kind"] == "path" else None
            help_text = meta["help"] + (_default(*meta["setting"]) if meta["setting"] else "")
            if job_default:
                help_text += f' A job\'s own "{f.name}" wins.'
            command = click.option(*meta["flags"], f.name, type=kind, default=None,
                                   required=meta["required"] and not job_default, help=help_text,
                                   metavar={"rate": "RATE", "profile": "NAME|FILE", "loudness": "off|LUFS",
                                            "timecode": "HH:MM:SS:FF"}.get(meta["kind"]))(command)
        return command
    return decorate


@contextmanager
def _bar(label: str, quiet: bool):
    """A progress callback (stage, done, total) on stderr (bars on a terminal, plain lines in a log; see
    ditto_fast/engine/progress.py); None when quiet."""
    if quiet:
        yield None
        return
    from ditto_fast.engine.progress import ProgressReport

    report = ProgressReport(label)
    try:
        yield report
    finally:
        report.close()


# ----------------------------------------------------------------------------- register
@cli.command()
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--name", help="Avatar name [A-Za-z0-9_-]{1,64}; default: the file stem.")
@click.option("--max-size", type=DeclaredSetting("register", "max_size"), default=None,
              help="Long side of the frames kept; larger sources are resized." + _default("register", "max_size"))
@click.option("--max-frames", type=click.IntRange(1), default=None, help="Use at most N frames.")
@click.option("--force", is_flag=True, help="Replace an existing avatar of that name.")
@click.option("--checkpoints", "checkpoints_dir", type=click.Path(path_type=Path), default=None,
              help="Checkpoint directory (default $DITTO_FAST_CHECKPOINTS or ./checkpoints).")
@click.option("--device", type=DEVICE, default="auto", show_default=True)
@click.option("--batch-size", type=DeclaredSetting("register", "batch_size"), default=None,
              help="Crops per batch." + _default("register", "batch_size"))
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--strict", is_flag=True, help="Refuse (exit 4) a source whose mouth is open, instead of a warning.")
@click.option("--source-colour", type=DeclaredSetting("register", "source_colour"), default=None,
              help="The colour matrix of the video's pixels: auto (its tag; untagged BT.709 from 1280x720 up, BT.601 "
                   "below), bt601 or bt709 (whatever its tag says)." + _default("register", "source_colour"))
@click.option("--face", type=DeclaredSetting("register", "face"), default=None, metavar="largest|left|right|N",
              help="The face to animate when the source shows several: the largest, the leftmost, the rightmost, or "
                   "the Nth from the left (1 = leftmost); a note names the one taken." + _default("register", "face"))
@CONFIG
def register(source, name, max_size, max_frames, force, checkpoints_dir, device, batch_size, quiet, strict,
             source_colour, face, config_path):
    """Register SOURCE (video or image) as an avatar: crops, features and plate cached for fast renders."""
    from ditto_fast.avatar.register import Registrar
    from ditto_fast.core.config import load_config
    from ditto_fast.core.memory import reuse_freed_memory

    config = load_config(config_path).register
    reuse_freed_memory()          # registration also returns the free pages every TRIM_EVERY frames
    registrar = Registrar(checkpoints_dir, device, config)
    with _bar("register", quiet) as report:
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
@click.option("--profile", type=click.Path(path_type=Path), default=None, help="Write stage timings as JSON.")
@click.option("--preview", type=click.Path(path_type=Path), default=None,
              help="Also write a PNG: thumbnails of the output, the waveform and the generated lip opening.")
@click.option("--quiet", is_flag=True, help="No progress bar or stage table.")
@CONFIG
def render(device, precision, batch_size, crf, preset, encoder, checkpoints_dir, profile, preview, quiet, config_path,
           **fields):
    """Render AUDIO spoken by AVATAR into a video file (written to a temporary name, renamed when complete)."""
    from ditto_fast.avatar import load_avatar
    from ditto_fast.checkpoints import find_checkpoints
    from ditto_fast.core.config import load_config
    from ditto_fast.core.memory import reuse_freed_memory
    from ditto_fast.engine.clip import check_clip
    from ditto_fast.engine.renderer import Renderer, stage_table
    from ditto_fast.engine.request import RenderRequest
    from ditto_fast.engine.setup import RenderSetup
    from ditto_fast.media.claims import claimed
    from ditto_fast.media.outputs import check_writes, write_json
    from ditto_fast.encoding.writer import check_output_path

    request = RenderRequest(**fields)
    config = load_config(config_path)
    cs = find_checkpoints(checkpoints_dir)
    # every input checked (the audio decoded, the avatar opened) before the networks load
    clip = check_clip(request, load_avatar(request.avatar, checkpoints=cs), config)
    for note in clip.notes:
        click.echo(f"ditto-fast: note: {note}", err=True)
    if preview is not None:
        from ditto_fast.preview.paths import check_png_path

        check_png_path(preview)
    if profile is not None:
        check_output_path(profile)
    check_writes([("output", clip.output), ("timings file (--profile)", profile), ("preview", preview)],
                 [*clip.inputs, config_path, cs.root])
    with claimed(clip.output):      # taken before the networks load: a second writer of this output fails fast
        reuse_freed_memory()
        renderer = Renderer(setup=RenderSetup.resolve(cs, device, precision, config, batch_size, crf, preset,
                                                      encoder))
        with _bar("render", quiet) as bar:
            result = renderer.render(clip, progress=bar)
    if profile:
        write_json(profile, result.profile)
    for warning in result.warnings:
        click.echo(f"ditto-fast: warning: {warning}", err=True)
    if not quiet:
        click.echo(stage_table(result.profile), err=True)
    if preview is not None:
        from ditto_fast.preview.render_strip import write_render_preview

        write_render_preview(preview, result.output, request.audio, result.profile["frames"], result.profile["rate"],
                             mouth=result.mouth, M_c2o=clip.avatar.M_c2o, size=clip.avatar.size,
                             random_weights=result.profile["random_weights"])
    click.echo(str(result.output))


# ----------------------------------------------------------------------------- batch
@cli.command()
@click.argument("jobs_file", required=False, type=click.Path(path_type=Path))
@click.option("--avatar", help="With --audio-dir: the avatar for every job.")
@click.option("--audio-dir", type=click.Path(path_type=Path), help="One job per audio file in this folder.")
@click.option("--out-dir", type=click.Path(path_type=Path),
              help="With --audio-dir: where <stem>.mp4 go (<stem>.mov with --codec prores, the profile's extension "
                   "with --delivery).")
@click.option("--report", type=click.Path(path_type=Path), default=None,
              help="Write every job's outcome here as JSON (rewritten after each job).")
@click.option("--force", is_flag=True, help="Render again jobs whose output was made from the same inputs.")
@click.option("--fail-fast", is_flag=True, help="Stop rendering after the first failed job.")
@click.option("--previews", "previews_dir", type=click.Path(path_type=Path), default=None,
              help="Write a preview PNG of each rendered job into this folder (<output stem>.png); "
                   "the report gives each job's \"preview\".")
@request_options(skip=("avatar", "audio", "output"), job_default=True)
@engine_options
@click.option("--quiet", is_flag=True, help="No progress bar or job table.")
@click.option("--ray", "ray_address", default=None, metavar="local|ADDRESS",
              help="Render on Ray actors: 'local' starts Ray here, ADDRESS joins a cluster (pip extra [ray]).")
@click.option("--workers", type=click.IntRange(1, 1024), default=None,
              help="With --ray: at most N actors [default: one per GPU, or per node without GPUs].")
@CONFIG
def batch(jobs_file, avatar, audio_dir, out_dir, report, force, fail_fast, previews_dir, device, precision,
          batch_size, crf, preset, encoder, checkpoints_dir, quiet, ray_address, workers, config_path, **defaults):
    """Render many clips with one engine: JOBS_FILE (JSON lines: avatar, audio, output, and optional steps, seed,
    emotion, controls, fps, codec, blend, delivery, loudness, timecode) or --avatar NAME --audio-dir IN --out-dir OUT.
    Exit 7 if any job failed."""
    from ditto_fast.batch.jobs import EXIT_SOME_FAILED, jobs_from_dir, read_jobs, summary
    from ditto_fast.batch.local import run_batch
    from ditto_fast.core.config import load_config
    from ditto_fast.core.memory import reuse_freed_memory
    from ditto_fast.engine.setup import RenderSetup

    by_dir = (avatar, audio_dir, out_dir)
    if jobs_file is not None and any(v is not None for v in by_dir):
        raise click.UsageError("give either JOBS_FILE or --avatar/--audio-dir/--out-dir, not both")
    if jobs_file is None and any(v is None for v in by_dir):
        raise click.UsageError("give JOBS_FILE, or all of --avatar NAME --audio-dir IN --out-dir OUT")
    config = load_config(config_path)
    defaults = {k: v for k, v in defaults.items() if v is not None}
    if "delivery" in defaults:          # every job's profile: a bad one is bad usage, before anything loads
        from ditto_fast.delivery.profiles import load_profile

        load_profile(defaults["delivery"])
    jobs = read_jobs(jobs_file, defaults) if jobs_file is not None else \
        jobs_from_dir(avatar, audio_dir, out_dir, defaults)
    if workers is not None and ray_address is None:
        raise click.UsageError("--workers goes with --ray")
    if previews_dir is not None and ray_address is not None:
        raise click.UsageError("--previews does not work with --ray yet; render previews with `render --preview`")
    if report is not None:
        from ditto_fast.encoding.writer import check_output_path

        check_output_path(report)
    from ditto_fast.batch.jobs import check_side_files
    from ditto_fast.checkpoints import resolve_root
    from ditto_fast.preview.paths import preview_paths

    previews = preview_paths(previews_dir, {j.index: j.output for j in jobs if j.output}) if previews_dir else {}
    check_side_files(jobs, report, previews, [jobs_file, config_path, resolve_root(checkpoints_dir)],
                     config.clip.emotion)
    if ray_address is not None:
        from ditto_fast.batch.ray_actors import run_batch_ray

        from ditto_fast.checkpoints import find_checkpoints

        setup_args = {"checkpoints": str(find_checkpoints(checkpoints_dir).root.resolve()), "device": device,
                      "precision": precision, "config": config, "batch_size": batch_size, "crf": crf,
                      "preset": preset, "encoder": encoder}
        with _bar("batch", quiet) as bar:
            run_batch_ray(jobs, setup_args, address=ray_address, workers=workers, force=force, fail_fast=fail_fast,
                          report=report, progress=bar,
                          warn=lambda text: click.echo(f"ditto-fast: warning: {one_line(text)}", err=True))
    else:
        setup = RenderSetup.resolve(checkpoints_dir, device, precision, config, batch_size, crf, preset, encoder)
        reuse_freed_memory()
        with _bar("batch", quiet) as bar:
            run_batch(jobs, setup, force=force, fail_fast=fail_fast, report=report, progress=bar,
                      previews=previews_dir)
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
    if counts["failed"]:
        sys.exit(EXIT_SOME_FAILED)


# ----------------------------------------------------------------------------- serve
@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything beyond this machine needs --token-file.")
@click.option("--port", type=click.IntRange(1, 65535), default=8750, show_default=True)
@click.option("--token-file", type=click.Path(path_type=Path), default=None,
              help="A file holding the bearer token every API request must carry.")
@click.option("--root", "roots", type=click.Path(path_type=Path), multiple=True,
              help="A folder the jobs' files may lie in (repeatable; the watch folders count) [default: the current "
                   "folder].")
@click.option("--watch", type=click.Path(path_type=Path), default=None,
              help="A watch folder: each speech file dropped in it becomes a job once it stops growing.")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="With --watch: where the outputs go.")
@click.option("--settle", type=click.FloatRange(0.5, 600), default=5.0, show_default=True,
              help="Seconds a dropped file's size and time must stay the same before it is taken.")
@click.option("--poll", type=click.FloatRange(0.1, 60), default=2.0, show_default=True,
              help="Seconds between looks at the watch folder.")
@request_options(skip=("audio", "output"), job_default=True)
@engine_options
@click.option("--quiet", is_flag=True, help="Log errors only (one JSON line each).")
@CONFIG
def serve(host, port, token_file, roots, watch, out, settle, poll, device, precision, batch_size, crf, preset, encoder,
          checkpoints_dir, quiet, config_path, **defaults):
    """Keep one engine loaded and render jobs from a durable queue: an HTTP job API (POST /v1/jobs, GET
    /v1/jobs/ID, DELETE, /healthz, /metrics, /docs) and an optional watch folder. One JSON log line per job state."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise click.UsageError('serve needs the [serve] extra: pip install -e ".[serve]"') from None
    from ditto_fast.core.config import load_config
    from ditto_fast.engine.setup import RenderSetup
    from ditto_fast.serve.server import ServeOptions, check_options, serve as run_server

    config = load_config(config_path)
    opts = ServeOptions(host=host, port=port, token_file=token_file, roots=list(roots), watch=watch, out=out,
                        defaults={k: (str(v.absolute()) if isinstance(v, Path) else v) for k, v in defaults.items()
                                  if v is not None},
                        settle_s=settle, poll_s=poll, quiet=quiet)
    check_options(opts)                 # before the networks load
    setup = RenderSetup.resolve(checkpoints_dir, device, precision, config, batch_size, crf, preset, encoder)
    try:
        run_server(setup, opts)
    except (KeyboardInterrupt, Terminated):     # uvicorn passes the signal on once it has stopped: a clean stop
        pass


# ----------------------------------------------------------------------------- qc
@cli.command("qc")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--delivery", metavar="NAME|FILE",
              help="The delivery profile to check against: a name from configs/delivery or a FILE.yaml. "
                   "Default: the shipped profile for the file's container and codec it comes closest to.")
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
    from ditto_fast.delivery import qc
    from ditto_fast.delivery.profiles import load_profile

    loudness, timecode = check_field("loudness", loudness), check_field("timecode", timecode)
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
@click.option("--preview", type=click.Path(path_type=Path), default=None,
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
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--tiny", is_flag=True, help="Tiny widths of the same architectures (fast CPU tests).")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True)
def checkpoints_init_random(directory, tiny, seed):
    """Write random weights for all six networks and HuBERT into DIRECTORY (outputs are labelled random)."""
    from ditto_fast.checkpoints.random_weights import write_random

    root = write_random(directory, tiny=tiny, seed=seed)
    click.echo(f"wrote {'tiny ' if tiny else ''}random checkpoints (seed {seed}) to {root}")


@checkpoints.command("info")
@click.option("--checkpoints", "checkpoints_dir", type=click.Path(path_type=Path), default=None)
def checkpoints_info(checkpoints_dir):
    """Load every network once and print its file, fingerprint and size."""
    from ditto_fast.checkpoints import find_checkpoints
    from ditto_fast.models import load

    cs = find_checkpoints(checkpoints_dir)
    fps = cs.fingerprints()
    for name, path in cs.files.items():
        net = load(name, path)
        n = sum(p.numel() for p in net.parameters())
        click.echo(f"{name:<22} {fps[name]}  {n / 1e6:8.2f}M params  {path}")
    click.echo(f"{'hubert':<22} {fps['hubert']}  {cs.hubert_dir}")
    if cs.random_weights:
        click.echo("these are RANDOM weights (ditto-fast checkpoints init-random): outputs are noise")


# ----------------------------------------------------------------------------- doctor
@cli.command()
@click.option("--checkpoints", "checkpoints_dir", type=click.Path(path_type=Path), default=None)
def doctor(checkpoints_dir):
    """Check ffmpeg, torch device, mediapipe models, checkpoints (each loaded) and the avatar store, one line each;
    changes nothing. Exit 6 if the checkpoints fail, 3 if the store is not writable."""
    from ditto_fast.doctor import run_checks

    failed = []
    for check in run_checks(checkpoints_dir):
        failed += [] if check.ok else [check.exit_code]
        click.echo(f"[{'ok' if check.ok else 'FAIL'}] {check.name:<12} {check.detail}")
    # 6 for the checkpoints, 3 for the store (a broken install, ffmpeg or torch say, leaves 1)
    sys.exit(next((c for c in failed if c != 1), failed[0]) if failed else 0)


if __name__ == "__main__":  # pragma: no cover
    entry()
