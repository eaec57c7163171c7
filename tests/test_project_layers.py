"""The package's imports point one way: down the data flow, never from a layer to one above it."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "ditto_fast"
# lowest first; a module may import from its own layer and the layers before it
LAYERS = (
    {"core"}, {"media"}, {"models"}, {"checkpoints"}, {"face"}, {"avatar"}, {"audio"}, {"motion"}, {"render"}, {"encoding"}, {"delivery"},
    {"preview"}, {"engine"}, {"batch"}, {"serve"}, {"doctor"}, {"console"}, {"cli"},
)


def _rank(module: str) -> int:
    head = module.split(".")[1]
    if head.startswith("__"):            # the package's own attributes (__version__)
        return 0
    return next(i for i, layer in enumerate(LAYERS) if head in layer)


def _imports(path: Path) -> tuple[str, set[str]]:
    """(dotted name of the module at `path`, the ditto_fast modules it imports, relative imports resolved)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    package = parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1]
            names = [node.module] if node.module else [a.name for a in node.names]
            found |= {".".join(base + [name]) for name in names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ditto_fast."):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("ditto_fast.")}
    return ".".join(parts), found


def test_no_module_imports_from_a_layer_above_it():
    upward = set()
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "__init__.py":
            continue
        module, imported = _imports(path)
        upward |= {(module, dst) for dst in imported if dst.count(".") and _rank(dst) > _rank(module)}
    assert not upward, sorted(upward)


def test_models_are_a_leaf():
    for path in (PACKAGE / "models").rglob("*.py"):
        module, imported = _imports(path)
        outside = {m for m in imported if not m.startswith("ditto_fast.models")}
        assert outside <= {"ditto_fast.core.errors"}, module


def test_the_package_root_holds_only_the_top_floor():
    """The root has the commands (cli, doctor) and folders; the ground-floor helpers live in core/ and media/."""
    root_modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert root_modules == {"cli", "doctor"}, root_modules
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders == set().union(*LAYERS) - root_modules, folders


def test_nothing_below_the_root_imports_from_it():
    """`from ditto_fast import X` names a subpackage, never an attribute of the root (no __init__ loop)."""
    modules = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if p.is_dir()}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "ditto_fast" and not node.level:
                assert {a.name for a in node.names} <= modules, (path, [a.name for a in node.names])
