"""The checks of a single value, one wording everywhere: choices, numbers in a range (never a boolean: True is an
int in Python), flags, text and paths. Each returns the value (numbers in their kind) or raises UsageError
'<where> must be ...' naming what is allowed; the settings, the declared fields and the delivery profiles use them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

from ditto_fast.core.errors import UsageError
from ditto_fast.core.files import check_path_text, shown


def refuse(where: str, what: str) -> NoReturn:
    """UsageError '<where> <what>' (`where` may be empty: a click option names itself)."""
    raise UsageError(f"{where} {what}".strip())


def check_choice(value: Any, choices: tuple, where: str) -> Any:
    """`value` if it is one of `choices`."""
    if isinstance(value, bool) or value not in choices:
        refuse(where, f"must be one of {', '.join(map(str, choices))}, got {shown(value)}")
    return value


def check_number(value: Any, low: float, high: float, where: str, *, integer: bool, unit: str = "",
                 words: tuple[str, ...] = ()) -> Any:
    """`value` as an int (`integer`) or a float within [low, high] (`unit` said after the range), or one of
    `words` (such as "auto"); a bool, a NaN or a fraction where an integer is wanted is refused."""
    if isinstance(value, str) and value in words:
        return value
    allowed = f"{low}..{high}{' ' + unit if unit else ''}{''.join(f' or {w}' for w in words)}"
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not numeric or value != value or (integer and isinstance(value, float) and not value.is_integer()):
        refuse(where, f"must be {'an integer' if integer else 'a number'} in {allowed}, got {shown(value)}")
    if not low <= value <= high:
        refuse(where, f"must be in {allowed}, got {shown(value)}")
    return int(value) if integer else float(value)


def check_flag(value: Any, where: str) -> bool:
    """`value` if it is True or False."""
    if not isinstance(value, bool):
        refuse(where, f"must be true or false, got {shown(value)}")
    return value


def check_text(value: Any, where: str, *, empty: bool = False) -> str:
    """`value` if it is a string (a non-empty one unless `empty`)."""
    if not isinstance(value, str) or not (empty or value.strip()):
        refuse(where, f"must be {'a string' if empty else 'a non-empty string'}, got {shown(value)}")
    return value


def check_path(value: Any, where: str) -> Path:
    """`value` (a non-empty str or Path that a file can have: no NUL, no name or path too long) as a Path."""
    if not isinstance(value, (str, Path)) or not str(value):
        refuse(where, f"must be a file path, got {shown(value)}")
    check_path_text(value, where)
    return Path(value)
