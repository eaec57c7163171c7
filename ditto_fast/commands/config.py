"""`ditto-fast config`: the settings in effect, as YAML."""

from __future__ import annotations

import click

from ditto_fast.console.options import CONFIG


@click.command("config")
@CONFIG
def config_cmd(config_path):
    """Print the settings in effect (the defaults, or with --config FILE that file's overrides), as YAML."""
    import dataclasses

    import yaml

    from ditto_fast.core.config import load_config

    click.echo(yaml.safe_dump(dataclasses.asdict(load_config(config_path)), sort_keys=False).rstrip())
