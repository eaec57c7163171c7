"""Where previews go: a .png the user names, or one per batch job in a folder, checked before any rendering."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from ditto_fast.core.errors import InputError, UsageError
from ditto_fast.core.files import check_path_length


def check_png_path(path: str | os.PathLike) -> Path:
    """Raise unless a .png can be written at `path` (UsageError for another suffix); call it before heavy work."""
    out = Path(path)
    if out.suffix.lower() != ".png":
        raise UsageError(f"{out}: a preview is a PNG; give a name ending in .png")
    check_path_length(out)
    if out.is_dir():
        raise InputError(f"{out}: is a directory; give a file name such as {out / 'preview.png'}")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{out}: directory {parent} does not exist; create it or choose another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{out}: cannot write in {parent}; choose another path")
    return out


def preview_paths(directory: str | os.PathLike, outputs: dict[int, Path]) -> dict[int, Path]:
    """One preview per job in `directory` (created if missing): <output stem>.png, or <stem>-<job>.png
    for stems that several jobs share. outputs: job index -> output path."""
    d = Path(directory)
    try:
        d.mkdir(exist_ok=True)
    except FileNotFoundError:
        raise InputError(f"{d}: --previews folder's parent does not exist; create it first") from None
    except OSError as exc:
        raise InputError(f"{d}: cannot create the --previews folder ({exc.strerror or exc})") from None
    if not d.is_dir() or not os.access(d, os.W_OK | os.X_OK):
        raise InputError(f"{d}: --previews must be a writable folder")
    stems = Counter(Path(p).stem for p in outputs.values())
    return {i: d / (f"{Path(p).stem}.png" if stems[Path(p).stem] == 1 else f"{Path(p).stem}-{i}.png")
            for i, p in outputs.items()}
