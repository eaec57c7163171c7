"""Declared fields: the one way an options object (the engine's, a render request, the server's) declares a field —
its command-line flags, kind, config setting, choices, range, help, whether it is required — and checks its value
when the object is made, whether from the command line, a job line or Python. The commands' click options are made
from the same declarations (console/options.py). Light to import: no torch, no numpy."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ditto_fast.core.checks import check_choice, check_number, check_path, check_text, refuse
from ditto_fast.core.config import check_setting, declaration
from ditto_fast.core.files import shown

KINDS = ("text", "path", "int", "float", "flag", "rate", "profile", "loudness", "timecode", "any")
# a value check of its own: (value, where) -> the value as kept; UsageError '<where> ...' otherwise
Check = Callable[[Any, str], Any]


def declared(default: Any = None, *, flags: tuple[str, ...] = (), kind: str = "text",
             setting: tuple[str, str] | None = None, choices: tuple[str, ...] | None = None,
             range: tuple[float, float] | None = None, required: bool = False, multiple: bool = False,
             check: Check | None = None, help: str = "") -> Any:
    """A declared dataclass field. `flags`: its command-line spelling (none: not an option of its own); `kind`: one
    of KINDS (text, a path, an int or float within `range`, or a value `check` knows); `setting`: the config
    declaration (section, key) giving its type, range and default; `choices`: its allowed words; `required` in
    every object; `multiple`: repeatable (a list); `check`: a check of its own, before the others."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    meta = {"flags": flags, "kind": kind, "setting": setting, "choices": choices, "range": range,
            "required": required, "multiple": multiple, "check": check, "help": help}
    return dataclasses.field(default_factory=list, metadata=meta) if multiple else \
        dataclasses.field(default=default, metadata=meta)


def is_declared(f: dataclasses.Field) -> bool:
    """Whether `f` was made by `declared`."""
    return "flags" in f.metadata


def check_value(f: dataclasses.Field, value: Any, where: str | None = None) -> Any:
    """`value` of the declared field `f` checked and normalised (paths as Path, numbers in their kind, a setting's
    word in lower case); UsageError naming `where` (the field's name by default)."""
    meta, where = f.metadata, f.name if where is None else where
    if value is None:
        if meta["required"]:
            refuse(where, "is missing")
        return None
    if meta["multiple"]:
        return [_checked(meta, v, where) for v in value]
    return _checked(meta, value, where)


def _checked(meta: dict, value: Any, where: str) -> Any:
    if meta["check"]:
        return meta["check"](value, where)
    if meta["setting"]:
        if declaration(*meta["setting"])["choices"] and isinstance(value, str):
            value = value.lower()               # H264 and h264 alike, as ffmpeg's names are
        return check_setting(*meta["setting"], value, where)
    if meta["choices"]:
        return check_choice(value, meta["choices"], where)
    if meta["kind"] in ("int", "float"):
        low, high = meta["range"]
        return check_number(value, low, high, where, integer=meta["kind"] == "int")
    if meta["kind"] == "path":
        return check_path(value, where)
    if meta["kind"] == "flag":
        if not isinstance(value, bool):
            refuse(where, f"must be true or false, got {shown(value)}")
        return value
    if meta["kind"] == "text":
        return check_text(value, where, empty=True)
    return value


def check_fields(obj: Any) -> None:
    """Every declared field of the dataclass `obj` checked and normalised in place (its __post_init__; a frozen
    one too)."""
    for f in dataclasses.fields(obj):
        if is_declared(f):
            object.__setattr__(obj, f.name, check_value(f, getattr(obj, f.name)))
