"""What every room of serve checks of what a client sends: text the queue and the answers keep (UTF-8 only), and
paths confined to the server's roots."""

from __future__ import annotations

import json
from pathlib import Path

from ditto_fast.core.errors import UsageError
from ditto_fast.core.files import check_path_text, printable


def check_utf8(data: dict, where: str) -> None:
    """UsageError for a job value holding text that is not UTF-8 (a file name in another encoding, read from a
    folder or sent as JSON's "\\udce4"): the queue keeps and answers UTF-8 only."""
    for key, value in data.items():
        try:
            json.dumps({key: value}, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            text = f" {printable(value)}" if isinstance(value, str) else ""
            raise UsageError(f"{where}: {printable(str(key))}{text} is not valid UTF-8 (a file name in another "
                             "encoding, Latin-1 from an SMB share?); rename it in UTF-8") from None
        except (TypeError, ValueError):             # not JSON: the request's own checks name it
            pass


def inside(real: Path, roots: list[Path]) -> bool:
    """Whether the real path `real` (links resolved) is one of `roots` or lies under one."""
    return any(real == r or r in real.parents for r in roots)


def confine(path: Path, roots: list[Path], what: str) -> None:
    """UsageError unless `path` (symbolic links followed) lies under one of `roots`."""
    check_path_text(path, what)
    if not inside(path.resolve(), roots):
        raise UsageError(f"{path}: the {what} is outside the folders this server may use "
                         f"({', '.join(map(str, roots))}); give a path under one of them")
