"""The package's imports point one way: down the data flow, never from a layer to one above it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "ditto_fast"
# lowest first; a module may import from its own layer and the layers before it
LAYERS = (
    {"core"}, {"media"}, {"models"}, {"checkpoints"}, {"face"}, {"avatar"}, {"audio"}, {"motion"}, {"render"},
    {"encoding"},
    {"delivery"},   # profiles and the QC of a written file (its captions read back too)
    {"captions"},   # cues, 608 pacing and embedding, sidecars: what a render's profile asks for (above delivery)
    {"preview"}, {"engine"},
    {"live"},       # the online session: the same stages on a frame clock
    {"handles"},    # the engine host: every process that loads the networks, carrying render jobs and live sessions
    {"batch"}, {"serve"},
    {"pipecat"},    # the Pipecat video service: a live session in the agent's process (above live, beside nothing)
    {"console"},    # what the commands share: their options, the process's exits
    {"commands"},   # one module a command
    {"cli"},        # the group of the commands, and main()
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


# serve's rooms, lowest first (docs/layout.md): what every room shares (the answers, the token's gate, the names it
# answers to, the checks of what a client sends, the decoded-audio memo, the metrics, the options, the service
# threads, the home's lock); the
# rooms side by side, none importing another (the jobs, the live sessions, the newsroom page); the app that wires
# their routes; the server that starts it all
SERVE = PACKAGE / "serve"
SERVE_FLOORS = (
    {"answers", "auth", "checks", "decoded", "health", "home_lock", "hosts", "metrics", "options", "service_thread"},
    {"jobs", "live", "page"},
    {"app"},
    {"server"},
)


def _serve_room(module: str) -> str:
    """The room of serve a module is in: its folder (jobs, live, page) or its own name at serve's top."""
    return module.split(".")[2]


def _serve_floor(room: str) -> int:
    return next(i for i, floor in enumerate(SERVE_FLOORS) if room in floor)


def test_every_room_of_serve_has_its_floor():
    rooms = {p.stem for p in SERVE.glob("*.py")} - {"__init__"}
    rooms |= {p.name for p in SERVE.iterdir() if (p / "__init__.py").exists()}
    assert rooms == set().union(*SERVE_FLOORS), rooms ^ set().union(*SERVE_FLOORS)


def test_serve_s_rooms_import_only_downward():
    """Within serve, a module imports from its own room or a floor below it (the shared modules at the bottom may use
    each other): jobs, live sessions and the page never import each other, nothing imports the app or the server
    but those above them (imports in functions and under TYPE_CHECKING count too)."""
    wrong = set()
    for path in SERVE.rglob("*.py"):
        module, imported = _imports(path)
        if module.count(".") < 2:           # serve's own __init__
            continue
        for node in ast.walk(ast.parse(path.read_text())):      # `from ditto_fast.serve import jobs`: the names
            if isinstance(node, ast.ImportFrom) and node.module == "ditto_fast.serve" and not node.level:
                imported |= {f"ditto_fast.serve.{a.name}" for a in node.names}
        src = _serve_room(module)
        for dst in imported:
            if not dst.startswith("ditto_fast.serve.") or _serve_room(dst) == src:
                continue
            down = _serve_floor(_serve_room(dst)) < _serve_floor(src)
            if not (down or _serve_floor(src) == _serve_floor(_serve_room(dst)) == 0):
                wrong.add((module, dst))
    assert not wrong, sorted(wrong)


def test_models_are_a_leaf():
    for path in (PACKAGE / "models").rglob("*.py"):
        module, imported = _imports(path)
        outside = {m for m in imported if not m.startswith("ditto_fast.models")}
        assert outside <= {"ditto_fast.core.errors"}, module


def test_the_package_root_holds_only_the_top_floor():
    """The root has the group of the commands (cli) and folders; the commands live in commands/, the ground-floor
    helpers in core/ and media/."""
    root_modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert root_modules == {"cli"}, root_modules
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders == set().union(*LAYERS) - root_modules, folders


def test_nothing_below_the_root_imports_from_it():
    """`from ditto_fast import X` names a subpackage, never an attribute of the root (no __init__ loop)."""
    modules = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if p.is_dir()}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "ditto_fast" and not node.level:
                assert {a.name for a in node.names} <= modules, (path, [a.name for a in node.names])


# What the commands import before they parse their arguments: the declarations (options, request, settings) and the
# command line. None of it may import these at module level (a network, numpy's and OpenCV's start-up cost, YAML
# read only when a file is); tests/test_project_startup.py checks the real processes.
HEAVY = ("torch", "numpy", "cv2", "transformers", "mediapipe", "scipy", "soxr", "imageio_ffmpeg", "PIL", "yaml",
         "fastapi", "uvicorn", "ray")
START_UP = ("ditto_fast.cli", "ditto_fast.serve.options", "ditto_fast.engine.options", "ditto_fast.engine.request")


def _module_file(module: str) -> Path | None:
    """The file of a ditto_fast module or package (None for an attribute such as a function)."""
    base = REPO / Path(*module.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.exists()), None)


def _loaded_at_import(path: Path) -> set[str]:
    """The modules `path` imports when it is imported: module and class level, `if TYPE_CHECKING:` and function
    bodies left out; for `from P import x` both P and P.x (x may be a submodule)."""
    module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1]) if node.level else ""
                source = ".".join(p for p in (base, node.module or "") if p)
                found.add(source)
                found.update(f"{source}.{a.name}" for a in node.names)
            elif isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, (ast.Try, ast.With, ast.ClassDef)):
                visit(node.body)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
    visit(ast.parse(path.read_text()).body)
    return found


def test_the_commands_start_without_heavy_imports():
    """`ditto-fast --help`, a usage error and the request's checks import no network, no numpy and no YAML: the
    declarations and the command line import only light modules (a heavy one is imported where it is used)."""
    chain: dict[str, str | None] = {m: None for m in START_UP}      # module -> the module that imported it
    todo = list(START_UP)
    while todo:
        module = todo.pop()
        parts = module.split(".")
        for i in range(2, len(parts) + 1):                      # a module's packages run their __init__ first
            package = ".".join(parts[:i - 1])
            if package not in chain and _module_file(package):
                chain[package] = module
                todo.append(package)
        path = _module_file(module)
        for name in sorted(_loaded_at_import(path)) if path else ():
            if name.split(".")[0] in HEAVY and name.split(".")[0] not in chain:
                chain[name.split(".")[0]] = module
            elif name.startswith("ditto_fast.") and name not in chain and _module_file(name):
                chain[name] = module
                todo.append(name)

    def route(module: str) -> str:
        return module if chain[module] is None else f"{route(chain[module])} -> {module}"
    heavy = [route(m) for m in HEAVY if m in chain]
    assert not heavy, heavy


def test_the_layout_names_every_room_in_the_order_of_its_layers():
    """docs/layout.md names each folder and each module of the root, in the order the layers go (lowest first), and
    every module of the engine host and of live."""
    text = (REPO / "docs" / "layout.md").read_text()
    tree = text.split("```")[1]                     # the drawing of the package
    named = [line.split()[0].rstrip("/").removesuffix(".py") for line in tree.splitlines()
             if line.startswith("  ") and not line.startswith("   ") and line.split()]
    rooms = [r for r in named if any(r in layer for layer in LAYERS)]
    assert sorted(rooms) == sorted(set().union(*LAYERS)), set().union(*LAYERS) ^ set(rooms)
    assert [_rank(f"ditto_fast.{r}") for r in rooms] == sorted(_rank(f"ditto_fast.{r}") for r in rooms), rooms
    for room in ("handles", "live"):
        for module in (PACKAGE / room).glob("*.py"):
            if module.stem != "__init__":
                assert f"{module.name}" in text, f"docs/layout.md does not name {room}/{module.name}"
    unnamed = [str(m.relative_to(PACKAGE)) for m in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.pyx")]
               if m.stem != "__init__" and not re.search(rf"(?<!\w){re.escape(m.stem)}(\.pyx?)?\b", tree)]
    assert not unnamed, f"docs/layout.md does not name these modules: {unnamed}"


def test_serve_starts_no_process_of_its_own():
    """Every process that loads the networks is the engine host's (handles/): serve asks it, it spawns nothing."""
    for path in (PACKAGE / "serve").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
            {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                    for a in n.names} | {(n.module or "").split(".")[0] for n in ast.walk(tree)
                                         if isinstance(n, ast.ImportFrom)}
        assert not names & {"Popen", "fork", "spawn", "executable", "posix_spawn"}, path
        assert not imported & {"subprocess", "multiprocessing"}, path
