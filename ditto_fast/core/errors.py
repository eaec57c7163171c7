"""Error types a user can cause, one per failure class; cli.py maps each to its exit code."""


MESSAGE_CHARS = 2000        # the longest message a user is shown; a longer one is cut in the middle
# the exit codes that are not an error class's own
EXIT_INTERNAL = 1           # a bug (one line; the traceback with DITTO_FAST_DEBUG=1)
EXIT_SOME_FAILED = 7        # some jobs of a batch failed (each job's own code is in its report row)
EXIT_INTERRUPTED = 130      # Ctrl-C (SIGINT), as a shell reports a process that a SIGINT ended
EXIT_TERMINATED = 143       # SIGTERM


def one_line(text: str, limit: int = MESSAGE_CHARS) -> str:
    """`text` as one line (line breaks in a file's name shown as \\n) of at most `limit` characters."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    if len(text) <= limit:
        return text
    half = (limit - 30) // 2
    return f"{text[:half]} ...({len(text) - 2 * half} chars cut)... {text[-half:]}"


class DittoError(Exception):
    """Base class: a failure with a one-line message that names the file and the fix (kept to one line of at most
    MESSAGE_CHARS characters, whatever values went into it)."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(one_line(str(message)), *args)


class UsageError(DittoError):
    """Bad arguments or options."""

    exit_code = 2


class InputError(DittoError):
    """An input file is missing, unreadable, corrupt or of the wrong kind."""

    exit_code = 3


class NoFaceError(DittoError):
    """No usable face in the source."""

    exit_code = 4


class AvatarError(DittoError):
    """Avatar missing, stale or damaged."""

    exit_code = 5


class CheckpointError(DittoError):
    """Checkpoints missing or incompatible."""

    exit_code = 6


class QCError(DittoError):
    """A deliverable fails its delivery profile's QC (nothing is left at the output path)."""

    exit_code = 8


class Terminated(BaseException):
    """Raised in the main thread on SIGTERM so that cleanup runs as for Ctrl-C (exit EXIT_TERMINATED)."""
