"""`ditto-fast qc`: any video file checked against a delivery profile, one line per requirement."""

from __future__ import annotations

import json
import sys

import click

from ditto_fast.console.options import PATH


@click.command("qc")
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
