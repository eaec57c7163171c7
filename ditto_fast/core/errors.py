"""Error types a user can cause, one per failure class; cli.py maps each to its exit code."""


class DittoError(Exception):
    """Base class: a failure with a one-line message that names the file and the fix."""

    exit_code = 1


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
    """Raised in the main thread on SIGTERM so that cleanup runs as for Ctrl-C (exit 143)."""
