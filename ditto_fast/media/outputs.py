"""The files a command writes (outputs, reports, timing files, previews): checked before any work to be none of its
inputs and each a different file, and written atomically (a hidden temporary beside, then a rename)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from ditto_fast.core.errors import InputError, UsageError
from ditto_fast.media.filemode import give_usual_mode
from ditto_fast.media.partfiles import create_locked, signals_held


def overwrites(output: str | os.PathLike, source: str | os.PathLike) -> bool:
    """Whether writing `output` would replace `source` or a file inside it (symbolic links followed)."""
    if not os.path.lexists(source):
        return False
    out, src = Path(output).resolve(), Path(source).resolve()
    return out == src or src in out.parents


def check_writes(writes: Iterable[tuple[str, str | os.PathLike | None]],
                 reads: Iterable[str | os.PathLike | None],
                 written: Iterable[tuple[str, str | os.PathLike | None]] = ()) -> None:
    """UsageError unless every file to be written ((what it is, path); None: not written) overwrites no input (a
    file read, or a file inside a folder read), no other file of `writes` and none of `written` (files written
    elsewhere, checked among themselves by their own writers)."""
    inputs = [Path(p) for p in reads if p is not None]
    taken = {Path(path).resolve(): what for what, path in written if path is not None}
    for what, path in writes:
        if path is None:
            continue
        for src in inputs:
            if overwrites(path, src):
                raise UsageError(f"{path}: the {what} would overwrite an input ({src}); choose another path")
        key = Path(path).resolve()
        if key in taken:
            raise UsageError(f"{path}: given as both the {taken[key]} and the {what}; give each its own path")
        taken[key] = what


def write_json(path: str | os.PathLike, data: Any) -> None:
    """`data` as indented JSON at `path`, replaced atomically (a reader never sees half of it; a killed writer's
    temporary is removed by the next write in that folder)."""
    path = Path(path)
    tmp, lock = None, None
    try:
        with signals_held():            # a Ctrl-C as the temporary appears comes once it is named: removed below
            tmp, lock = create_locked(path, "tmp")
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, default=str)
            f.write("\n")
        give_usual_mode(tmp)
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        if lock is not None:
            os.close(lock)
