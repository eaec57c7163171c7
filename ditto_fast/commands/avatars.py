"""`ditto-fast avatars`: the registered avatars listed, one shown (and previewed), one removed."""

from __future__ import annotations

import json

import click

from ditto_fast.console.options import PATH


@click.group(invoke_without_command=True)
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
