"""The `ditto-fast` group of the commands (register, render, batch, serve, live, qc, config, avatars, checkpoints,
doctor: each in its module under commands/), and main(), which maps error classes to exit codes."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import click

from ditto_fast.commands.avatars import avatars
from ditto_fast.commands.batch import batch
from ditto_fast.commands.checkpoints import checkpoints
from ditto_fast.commands.config import config_cmd
from ditto_fast.commands.doctor import doctor
from ditto_fast.commands.live import live
from ditto_fast.commands.qc import qc_cmd
from ditto_fast.commands.register import register
from ditto_fast.commands.render import render
from ditto_fast.commands.serve import serve
from ditto_fast.console.process import end_process, on_sigterm
from ditto_fast.console.process import exit_now as _exit_now       # tests replace it: an interrupt ends no test run
from ditto_fast.core.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_TERMINATED, DittoError, Terminated, one_line
from ditto_fast.core.version import __version__


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


for command in (register, render, batch, serve, live, qc_cmd, config_cmd, avatars, checkpoints, doctor):
    cli.add_command(command)


if __name__ == "__main__":  # pragma: no cover
    entry()
