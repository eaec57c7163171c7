"""`ditto-fast register`: a video or an image made into an avatar."""

from __future__ import annotations

import click

from ditto_fast.console.options import CONFIG, ENGINE, PATH, QUIET, progress_bar, setting_option


@click.command()
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
