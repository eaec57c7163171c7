"""Shared fixtures: the parity files in ../shared, tiny random checkpoints, synthetic media."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ditto_fast.engine.precision import BF16_FLAGS, cpu_kind

REPO = Path(__file__).resolve().parents[1]
# one precision for every test render on any CPU kind (the rule's own tests unset it): outputs compared across
# machines' recorded digests and processes come from the same arithmetic
os.environ["DITTO_FAST_CPU_PRECISION"] = "fp32"
# a run started in the background by a shell ignores SIGINT, and every process it starts would inherit that: the
# tests that end a stream or a render with SIGINT need the default (a Python handler is reset to it across exec)
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
SHARED = Path(os.environ.get("DITTO_FAST_SHARED", REPO.parent / "shared"))
PARITY = SHARED / "parity"
# CI's second stack (no mediapipe) reads the tiny checkpoints, anchor and avatar that the first stack made
# (tests/stack_fixtures.py DIR): then `tiny_checkpoints`, `anchor_video` and `video_avatar` are copies of them
STACK_FIXTURES = Path(os.environ["DITTO_FAST_STACK_FIXTURES"]) if os.environ.get("DITTO_FAST_STACK_FIXTURES") else None


# Full-size bf16 passes on a CPU without bf16 arithmetic (AVX2-only machines) are emulated and take many
# minutes each; there they are skipped (the tiny-network bf16 tests still run the same code).
native_bf16 = pytest.mark.skipif(not set(BF16_FLAGS) & set(cpu_kind()["flags"]),
                                 reason="this CPU has no bf16 arithmetic (no AVX512-BF16 or AMX): a full-size "
                                        "bf16 pass is emulated and takes minutes")


def _need_parity() -> None:
    if not (PARITY / "layout.json").exists():
        pytest.skip(f"parity files not found at {PARITY} (set DITTO_FAST_SHARED or place ../shared beside the repo)")


@pytest.fixture(scope="session")
def parity_layout() -> dict:
    _need_parity()
    return json.loads((PARITY / "layout.json").read_text())


@pytest.fixture(scope="session")
def parity_vectors() -> dict:
    _need_parity()
    with np.load(PARITY / "vectors_seed0.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="session")
def logic_vectors() -> dict:
    _need_parity()
    with np.load(PARITY / "logic_seed0.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="session")
def fill_state_dict():
    _need_parity()
    spec = importlib.util.spec_from_file_location("parity_fill", PARITY / "fill.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.fill_state_dict


@pytest.fixture(scope="session")
def parity_checkpoint(tmp_path_factory, parity_layout, fill_state_dict):
    """parity_checkpoint(name) -> path of a .pth in the published wrapping with fill.py weights (seed 0)."""
    root = tmp_path_factory.mktemp("parity_ckpt")
    made: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name not in made:
            entry = parity_layout[name]
            sd = fill_state_dict(entry["keys"], seed=0)
            wrapping = entry["checkpoint_wrapping"]
            obj = {wrapping.split(":", 1)[1]: sd} if wrapping.startswith("dict:") else sd
            path = root / f"{name}.pth"
            torch.save(obj, path)
            made[name] = path
        return made[name]

    return make


def layout_shapes(keys: dict) -> dict[str, torch.Tensor]:
    """A state dict of a parity layout's keys ({key: {"shape", "dtype"}}) as tensors on the meta device: the shapes
    and dtypes without memory or values, for code that reads only shapes (widths_from_state_dict)."""
    return {k: torch.empty(v["shape"], dtype=getattr(torch, v["dtype"]), device="meta") for k, v in keys.items()}


def assert_close_to_ref(got: np.ndarray, ref: np.ndarray, what: str, rel: float = 2e-3) -> None:
    """The parity tolerance: max|got-ref| <= rel * max(1, max|ref|)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    err = float(np.abs(got - ref).max())
    tol = rel * max(1.0, float(np.abs(ref).max()))
    assert err <= tol, f"{what}: max abs error {err:.3g} > tolerance {tol:.3g}"


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> Path:
    """A checkpoint root with tiny random weights for all six networks and HuBERT (written once)."""
    from ditto_fast.checkpoints.random_weights import write_random

    root = tmp_path_factory.mktemp("ckpt_tiny")
    if STACK_FIXTURES:           # the first stack's files, so that its avatars match them
        shutil.copytree(STACK_FIXTURES / "checkpoints", root, dirs_exist_ok=True)
        return root
    write_random(root, tiny=True, seed=0)
    return root


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models run fastest on one thread; on a shared, busy CPU more threads spin and crawl."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_hubert_dir(tmp_path_factory):
    """A tiny random HuBERT directory in the transformers layout (written once)."""
    from ditto_fast.checkpoints.random_hubert import write_random_hubert

    return write_random_hubert(tmp_path_factory.mktemp("hubert_tiny"), tiny=True, seed=0)


def store_env(home: Path, ckpt: Path) -> dict[str, str]:
    """The environment that points ditto-fast at avatar store `home` and checkpoint root `ckpt`."""
    return {"DITTO_FAST_HOME": str(home), "DITTO_FAST_CHECKPOINTS": str(ckpt)}


def cli_exit_code(args: list) -> int:
    """`ditto-fast ARGS` through `ditto_fast.cli.main` in this process; the exit code main() ends with."""
    from ditto_fast import cli as cli_module

    try:
        cli_module.main([str(a) for a in args])
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)


@pytest.fixture()
def run_cli(capfd, monkeypatch):
    """run_cli(args, env=None) -> CompletedProcess: `ditto-fast ARGS` run in this process.

    Goes through `ditto_fast.cli.main`, so exit codes and the one stderr line come from the same mapping
    of DittoError and Click errors as in a real process, without a new interpreter's ~2.4 s of imports.
    Output is captured at the file descriptors, so what child processes or C libraries print counts too.
    For the tests whose point is a real process (signals, rlimits, full renders) use a subprocess.
    """
    from ditto_fast import cli as cli_module

    def run(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
        sigterm = signal.getsignal(signal.SIGTERM)       # main() installs its own SIGTERM handler
        capfd.readouterr()                               # drop what the test printed before
        with monkeypatch.context() as mp:
            for key, value in (env or {}).items():
                mp.setenv(key, value)

            def interrupted(code: int) -> None:          # main() would os._exit() the test run on an interrupt
                raise KeyboardInterrupt(f"ditto-fast exit {code}")

            mp.setattr(cli_module, "_exit_now", interrupted)
            try:
                code = cli_exit_code(args)
            finally:
                signal.signal(signal.SIGTERM, sigterm)
        out = capfd.readouterr()
        return subprocess.CompletedProcess(["ditto-fast", *map(str, args)], code, out.out, out.err)

    return run


@pytest.fixture()
def ditto_home(tmp_path, monkeypatch) -> Path:
    """An empty avatar store for one test ($DITTO_FAST_HOME)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DITTO_FAST_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def speech_wav() -> Path:
    """~10 s of English speech, 16 kHz mono, committed in tests/data."""
    return REPO / "tests" / "data" / "speech_en_16k.wav"


@pytest.fixture(scope="session")
def anchor_video(tmp_path_factory) -> Path:
    """A 1 s 1920x1080 H.264 anchor video tagged BT.709: the astronaut (face ~150 px) drifting by a known motion."""
    path = tmp_path_factory.mktemp("anchor") / "anchor.mp4"
    if STACK_FIXTURES:
        shutil.copyfile(STACK_FIXTURES / "anchor.mp4", path)
        return path
    from synthetic import write_test_anchor

    return write_test_anchor(path)   # HD, tagged as HD is


# the known motion of `anchor_video`: 1.5 px/frame right, 0.5 px/frame down, 0.1 degree/frame
from synthetic import TEST_ANCHOR_MOTION as ANCHOR_MOTION  # noqa: E402,F401


@pytest.fixture(scope="session")
def session_home(tmp_path_factory):
    """An avatar store shared by the session's registered avatars ($DITTO_FAST_HOME set for the session)."""
    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    mp.setenv("DITTO_FAST_HOME", str(home))
    yield home
    mp.undo()


@pytest.fixture(scope="session")
def video_avatar(session_home, tiny_checkpoints, anchor_video):
    """`anchor_video` registered as avatar 'anchor' with the tiny checkpoints; returns its directory."""
    if STACK_FIXTURES:           # registered by the first stack (this one may have no mediapipe)
        dest = session_home / "avatars" / "anchor"
        shutil.copytree(STACK_FIXTURES / "home" / "avatars" / "anchor", dest)
        return dest
    from ditto_fast.avatar.register import register_avatar

    return register_avatar(anchor_video, name="anchor", checkpoints=tiny_checkpoints, device="cpu")


@pytest.fixture(scope="session")
def clips(tmp_path_factory, speech_wav):
    """Three short speech clips (0.4, 0.6 and 0.5 s) cut from the test speech."""
    import soundfile as sf

    d = tmp_path_factory.mktemp("clips")
    audio, sr = sf.read(speech_wav, dtype="float32")
    paths = []
    for i, (start, dur) in enumerate(((1.0, 0.4), (3.0, 0.6), (5.0, 0.5))):
        p = d / f"clip{i}.wav"
        sf.write(p, audio[int(start * sr):int((start + dur) * sr)], sr)
        paths.append(p)
    return paths


@pytest.fixture(scope="session")
def engine(video_avatar, tiny_checkpoints):
    """One render engine with the tiny checkpoints on the CPU, shared by the session."""
    from ditto_fast.engine.renderer import Renderer

    return Renderer(tiny_checkpoints, device="cpu")


@pytest.fixture(scope="session")
def blend_kernel():
    """The compiled _blend module, built in place if missing; skips when no C compiler is available."""
    try:
        mod = importlib.import_module("ditto_fast.render._blend")
    except ImportError:
        if shutil.which("cc") is None and shutil.which("gcc") is None:
            pytest.skip("no C compiler available to build ditto_fast.render._blend")
        res = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
        if res.returncode != 0:
            pytest.skip(f"building ditto_fast.render._blend failed: {res.stderr.strip().splitlines()[-1:]}")
        importlib.invalidate_caches()
        mod = importlib.import_module("ditto_fast.render._blend")
    from ditto_fast.render import putback

    putback._blend = mod
    return mod


@pytest.fixture(scope="session")
def local_ray(tmp_path_factory):
    """One real Ray cluster for every Ray test (batch --ray, serve --ray): 2 CPUs, its temp dir under the tests'."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=str(tmp_path_factory.mktemp("ray")))
    yield ray
    ray.shutdown()


def pytest_collection_modifyitems(config, items):
    """A test that runs mediapipe (marked register) is slow too: the quick tier (-m "not slow") leaves it out. The
    tests on the shared Ray cluster run last, so that it idles beside no other test, and live in *_ray.py files."""
    for item in items:
        if item.get_closest_marker("register") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
    on_ray = [item for item in items if "local_ray" in getattr(item, "fixturenames", ())]
    items.sort(key=lambda item: item in on_ray)
    stray = [item.nodeid for item in on_ray if not item.path.name.endswith("_ray.py")]
    if stray:
        raise pytest.UsageError(f"a test on the shared Ray cluster belongs in a *_ray.py file (one worker runs "
                                f"those): {stray}")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """scripts/test.sh's workers (--dist loadfile): each test file on one worker, and the files of the Ray tests
    (*_ray.py) all on the same one, so that a run starts one Ray cluster."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class RayFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "ray" if scope.endswith("_ray.py") else scope

    return RayFilesTogether(config, log)


# ----------------------------------------------------------------------------- serve, in process
SERVE_TOKEN = "t" * 20


@pytest.fixture()
def serve_parts(engine, session_home, tmp_path):
    """A server's parts over a fresh queue and the session's engine (in this process), its roots [tmp_path], its
    dispatch thread not started (jobs stay queued): queue, acceptor, dispatcher, metrics and the log's events."""
    from types import SimpleNamespace

    from ditto_fast.engine.open_avatars import OpenAvatars
    from ditto_fast.handles.local import LocalEngine
    from ditto_fast.serve.jobs.accept import Acceptor
    from ditto_fast.serve.jobs.dispatch import Dispatcher
    from ditto_fast.serve.metrics import Metrics
    from ditto_fast.serve.jobs.queue import JobQueue

    queue = JobQueue(tmp_path / "q.sqlite")
    metrics = Metrics(queue)
    events: list[dict] = []
    avatars = OpenAvatars(engine.setup.checkpoints)
    acceptor = Acceptor(queue, engine.setup, [tmp_path], avatars=avatars.get)
    dispatcher = Dispatcher([LocalEngine(renderer=engine)], queue, metrics, events.append, avatars, engine.setup,
                            audio=acceptor.decoded, at_start=acceptor.at_start)
    return SimpleNamespace(queue=queue, acceptor=acceptor, dispatcher=dispatcher, metrics=metrics, events=events)


@pytest.fixture()
def api(serve_parts):
    """The job API in process over `serve_parts`, with a token: (client carrying the token, queue, log events)."""
    from fastapi.testclient import TestClient

    from ditto_fast.serve.app import make_app

    parts = serve_parts
    client = TestClient(make_app(parts.queue, parts.acceptor, parts.dispatcher, parts.metrics, token=SERVE_TOKEN))
    client.headers["Authorization"] = "Bearer " + SERVE_TOKEN
    return client, parts.queue, parts.events


# ----------------------------------------------------------------------------- serve, a real server
@pytest.fixture()
def serving(video_avatar, session_home, tiny_checkpoints, tmp_path):
    from support import Server

    servers: list[Server] = []

    def make(*extra: str) -> Server:
        servers.append(Server(store_env(tmp_path / "home", tiny_checkpoints), tmp_path, *extra).start())
        return servers[-1]

    avatars = tmp_path / "home" / "avatars"
    avatars.mkdir(parents=True)
    shutil.copytree(video_avatar, avatars / "anchor")        # this test's own store: its own queue
    yield make
    for s in servers:
        if s.proc.poll() is None:
            s.stop(signal.SIGKILL)
