"""Restricted unpickling: numpy arrays and plain containers, nothing else.

`load(file)` / `loads(data)` read a pickle whose only globals may be the few numpy
reconstructors that rebuild arrays, dtypes and scalars (numpy 1.x ``numpy.core`` and 2.x
``numpy._core`` spellings) and ``builtins.complex``; dicts, lists, tuples, sets, str, bytes,
int, float, bool and None need no globals at all. Any other global (``os.system``,
``builtins.eval``, ``collections.OrderedDict``, ...) is refused *before* it is looked up, so a
malicious pickle cannot run code. Object-dtype arrays are refused after loading too, so no
Python object can hide inside an array, and a record nested too deep or too large (counting shared
references, so an 88 KB reference bomb is refused at once) is refused without walking it all. Every refusal or decoding failure raises AvatarError.
"""

from __future__ import annotations

import io
import pickle
from typing import IO, Any

import numpy as np

from ditto_fast.core.errors import AvatarError

# (module, name) pairs a cache pickle may reference.
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy._core.numeric", "_frombuffer"),
        ("builtins", "complex"),
    }
)

# the spelling this numpy has: an avatar pickled under numpy 1 (registration) is read without numpy 2's
# deprecation path, and one pickled under numpy 2 reads under numpy 1
_NUMPY_2 = int(np.__version__.split(".")[0]) >= 2
_NUMPY_CORE = ({"numpy.core.multiarray": "numpy._core.multiarray", "numpy.core.numeric": "numpy._core.numeric"}
               if _NUMPY_2 else
               {"numpy._core.multiarray": "numpy.core.multiarray", "numpy._core.numeric": "numpy.core.numeric"})

DEFAULT_HINT = "re-register the avatar with `ditto-fast register SOURCE --name NAME --force`"


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler whose find_class admits only ALLOWED_GLOBALS."""

    def __init__(self, file: IO[bytes], what: str, hint: str) -> None:
        super().__init__(file)
        self._what = what
        self._hint = hint

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED_GLOBALS:
            raise AvatarError(
                f"{self._what} contains a disallowed object {module}.{name}; {self._hint}"
            )
        return super().find_class(_NUMPY_CORE.get(module, module), name)

    def persistent_load(self, pid: Any) -> Any:
        raise AvatarError(f"{self._what} contains a persistent reference; {self._hint}")


# bounds on the record as a tree (shared references counted at every place they appear): an avatar record is a
# few levels deep with a few hundred entries, so these leave room, yet no walk of it (ours, json, repr) can explode
MAX_DEPTH = 32
MAX_NODES = 100_000


def _check_tree(obj: Any, what: str, hint: str) -> None:
    """AvatarError if obj holds an object array, a cycle, or, counting a shared container at every place it
    appears, more than MAX_NODES entries or MAX_DEPTH levels; each container is walked once (by id)."""
    sizes: dict[int, int] = {}            # id -> entries under it as a tree, for containers already walked
    on_path: set[int] = set()             # containers being walked (one of them seen again is a cycle)
    stack: list[tuple[Any, int, bool]] = [(obj, 0, False)]
    while stack:
        item, depth, done = stack.pop()
        if isinstance(item, np.ndarray):
            if item.dtype.hasobject:
                raise AvatarError(f"{what} contains a disallowed object array (dtype {item.dtype}); {hint}")
            continue
        if isinstance(item, dict):
            children: Any = (*item.keys(), *item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            children = item
        else:
            continue
        key = id(item)
        if done:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes.get(id(c), 1) for c in children)
            if sizes[key] > MAX_NODES:
                raise AvatarError(f"{what} is not an avatar record (more than {MAX_NODES:,} entries counting "
                                  f"shared references); {hint}")
        elif key not in sizes:
            if key in on_path:
                raise AvatarError(f"{what} is not an avatar record (it refers to itself); {hint}")
            if depth >= MAX_DEPTH:
                raise AvatarError(f"{what} is not an avatar record (nested more than {MAX_DEPTH} deep); {hint}")
            on_path.add(key)
            stack.append((item, depth, True))
            stack.extend((c, depth + 1, False) for c in children)


def load(file: IO[bytes], what: str = "avatar.pkl", hint: str = DEFAULT_HINT) -> Any:
    """Unpickle from a binary file, admitting only numpy arrays and plain containers."""
    try:
        obj = _RestrictedUnpickler(file, what, hint).load()
    except AvatarError:
        raise
    except Exception as exc:  # any decoding failure means the file is damaged
        raise AvatarError(
            f"{what} is damaged ({type(exc).__name__}: {exc}); {hint}"
        ) from exc
    _check_tree(obj, what, hint)
    return obj


def loads(data: bytes, what: str = "avatar.pkl", hint: str = DEFAULT_HINT) -> Any:
    """Unpickle from bytes, admitting only numpy arrays and plain containers."""
    return load(io.BytesIO(data), what, hint)
