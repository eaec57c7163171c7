"""`ditto-fast checkpoints`: random weights written in the published layout, or every network's file inspected."""

from __future__ import annotations

import click

from ditto_fast.console.options import ENGINE, PATH


@click.group()
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
