"""The command's process: SIGTERM raised as an exception (so clean-up runs as for Ctrl-C), the exit after an
interrupt, and the exit without the interpreter's teardown."""

from __future__ import annotations

import os
import signal
import sys
from typing import Callable

import click

from ditto_fast.core.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated


def on_sigterm(signum, frame):  # pragma: no cover - exercised via subprocess tests
    """The SIGTERM handler: raise Terminated in the main thread."""
    raise Terminated()


def exit_now(code: int) -> None:
    """Exit with `code` at once after an interrupt (cleanup already ran in the stages' context managers).

    A plain sys.exit can be turned into death-by-SIGINT when the interrupt also surfaced inside a
    finalizer during shutdown; scripts rely on the documented EXIT_INTERRUPTED and EXIT_TERMINATED.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def end_process(main: Callable[[], None]) -> None:
    """Run `main` (the CLI's, which maps failures to exit codes), then exit without the interpreter's teardown.

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
            code = EXIT_INTERNAL
    except KeyboardInterrupt:       # one that arrived after main() had mapped its own
        code = EXIT_INTERRUPTED
    except Terminated:
        code = EXIT_TERMINATED
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):   # a reader gone (| head) or no stream at all (>&-)
            pass
    if "ray" in sys.modules:
        sys.exit(code)
    os._exit(code)
