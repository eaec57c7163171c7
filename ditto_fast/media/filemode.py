"""File modes as any other program's: what the process's umask allows (0644 files, 0755 directories under 022).

Temporary files made with mkstemp/mkdtemp are private (0600/0700); call `give_usual_mode` before
renaming one into place.
"""

from __future__ import annotations

import os


def process_umask() -> int:
    """The process's umask, read without changing it (Linux /proc; elsewhere set and restored)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def give_usual_mode(path: str | os.PathLike, directory: bool = False) -> None:
    """chmod `path` to 0666 (0777 for a directory) less the umask."""
    os.chmod(path, (0o777 if directory else 0o666) & ~process_umask())
