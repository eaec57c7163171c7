"""What several test files share: the putback's float reference and test pictures, YUV planes from RGB, a render's
hash with its digest tag blanked, another process holding an output's claim; synthetic avatars written to a store,
avatar.pkl's record read, rewritten and re-sealed, and a time limit on a block. (Fixtures live in conftest.py.)"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import cv2
import numpy as np

from ditto_fast.avatar import AvatarWriter, safe_pickle
from ditto_fast.avatar import format as fmt
from ditto_fast.media.yuv import Layout, rgb_to_yuv_matrix
from ditto_fast.render.putback import feathered_mask


def reference_putback(bg: np.ndarray, crop: np.ndarray, M_c2o: np.ndarray) -> np.ndarray:
    """Full-frame float32 blend: warp crop and mask over the whole frame, blend, round."""
    h, w = bg.shape[:2]
    mask = feathered_mask(crop.shape[0])
    mask_w = cv2.warpAffine(mask, M_c2o[:2], (w, h), flags=cv2.INTER_LINEAR).clip(0, 1)[..., None]
    crop_w = cv2.warpAffine(crop.astype(np.float32), M_c2o[:2], (w, h), flags=cv2.INTER_LINEAR)
    out = mask_w * crop_w + (1.0 - mask_w) * bg.astype(np.float32)
    return np.round(out).clip(0, 255).astype(np.uint8)


def smooth_crop(rng: np.random.Generator, size: int = 512, cells: int = 24) -> np.ndarray:
    """Random band-limited crop (like a rendered face, unlike white noise).

    OpenCV quantises warp source coordinates to 1/32 px and rounds them differently for a
    translated ROI than for the full frame, so white noise can differ by ~10 levels between the
    two warps; with image-like content the difference stays within one level.
    """
    small = rng.integers(0, 256, (cells, cells, 3), dtype=np.uint8)
    return cv2.resize(small, (size, size), interpolation=cv2.INTER_CUBIC)


def similarity(scale: float, angle: float, tx: float, ty: float) -> np.ndarray:
    """3x3 crop->frame matrix: rotate by angle (radians), scale, translate."""
    c, s = scale * np.cos(angle), scale * np.sin(angle)
    return np.array([[c, -s, tx], [s, c, ty], [0.0, 0.0, 1.0]])


CASES = {
    "scale_translate": ((360, 640), similarity(0.8, 0.0, 150.3, 20.7)),
    "rotated": ((360, 640), similarity(0.7, 0.35, 250.0, 10.0)),
    "rotated_neg_upscale": ((360, 640), similarity(1.1, -0.6, 100.0, 150.0)),
    "left_top_outside": ((360, 640), similarity(0.9, 0.2, -180.0, -120.0)),
    "right_bottom_outside": ((360, 640), similarity(0.9, -0.1, 480.0, 250.0)),
    "larger_than_frame": ((200, 300), similarity(1.5, 0.1, -200.0, -250.0)),
    "quarter_turn": ((360, 640), similarity(0.6, np.pi / 2, 400.0, 20.0)),
    "sheared_flipped": ((360, 640), np.array([[0.5, 0.2, 200.0], [0.1, -0.6, 340.0], [0.0, 0.0, 1.0]])),
}


def background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A random band-limited RGB picture [h, w, 3]."""
    return cv2.resize(rng.integers(0, 256, (h // 20, w // 20, 3), dtype=np.uint8), (w, h),
                      interpolation=cv2.INTER_CUBIC)


def planes_of(rgb: np.ndarray, layout: Layout) -> np.ndarray:
    """A limited-range BT.709 frame in `layout` from RGB (float conversion; chroma averaged as it is subsampled)."""
    h, w = rgb.shape[:2]
    yuv = cv2.transform(rgb.astype(np.float32), rgb_to_yuv_matrix("bt709") * layout.scale)
    frame = np.empty(layout.shape(w, h), layout.dtype)
    luma, chroma = layout.planes(frame)
    luma[0] = np.rint(yuv[..., 0])
    uv = cv2.resize(yuv[..., 1:], (w // 2, h // layout.chroma_rows), interpolation=cv2.INTER_AREA)
    chroma[0], chroma[1] = np.rint(uv[..., 0]), np.rint(uv[..., 1])
    return frame


def blanked_sha256(path: Path) -> str:
    """The file's sha256 with its digest tag's hash blanked (the digest names the avatar's creation time, which
    differs per registration); the three paths' whole files are compared too."""
    data = path.read_bytes()
    blanked = re.sub(rb"(ditto-fast [0-9.]+ )[0-9a-f]{32}", rb"\g<1>" + b"0" * 32, data)
    assert blanked != data, "no digest tag in the output"
    return hashlib.sha256(blanked).hexdigest()


HOLD = textwrap.dedent("""
    import importlib, sys
    module, name = sys.argv[2].split(":")
    with getattr(importlib.import_module(module), name)(sys.argv[1]):
        print("held", flush=True)
        sys.stdin.read()            # until the test closes our stdin (or kills us)
""")


def hold(target: Path, lock: str = "ditto_fast.media.claims:claimed") -> subprocess.Popen:
    """Another process that holds `lock` (module:function, a context manager taking a path; default: the claim on
    output `target`) on `target` until its stdin is closed."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(target), lock], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "held\n"
    return p


def gone_lease():
    """The serve queue's lease of a server that is gone (its process has exited)."""
    import uuid

    from ditto_fast.serve.jobs.lease import Lease

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return Lease(uuid.uuid4().hex, Lease.this_process().host, child.pid, "a start long gone")


class Receiver:
    """A callback receiver on 127.0.0.1 (a thread): each POST's path, Host header and JSON body in `got`; it answers
    `answer` (with a Location header when `location` is set)."""

    def __init__(self):
        import http.server
        import threading

        receiver = self
        self.got: list[dict] = []
        self.answer, self.location = 204, None

        class Hook(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.got.append({"path": self.path, "host": self.headers["Host"], "body": body})
                self.send_response(receiver.answer)
                if receiver.location:
                    self.send_header("Location", receiver.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()   # shut down at once

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def bodies(self, timeout: float = 60) -> list[dict]:
        """The bodies received, once there is one (AssertionError if none comes within `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while not self.got:
            assert time.monotonic() < deadline, "no callback arrived"
            time.sleep(0.05)
        return [g["body"] for g in self.got]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def processes_naming(text: str) -> list[int]:
    """The processes whose command line holds `text` (a path they were given, say)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        if text.encode() in command and int(entry) != os.getpid():
            found.append(int(entry))
    return found


def until_gone(pids: list[int], timeout: float = 30) -> None:
    """Wait until none of `pids` runs any more (a zombie counts as gone: its parent may be gone too)."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while True:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                        break
            except OSError:
                break
            assert time.monotonic() < deadline, f"process {pid} still runs"
            time.sleep(0.05)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def busy_message(target: Path, pid: int) -> str:
    return (f"{target}: is being written by another process (pid {pid}); wait for it to finish or choose another "
            "output path")


# the synthetic avatars: their checkpoint fingerprints and a small feature tail (registration writes [32, 16, 64, 64])
FP = {"appearance_extractor": "a1b2c3d4e5f60718", "motion_extractor": "0918f7e6d5c4b3a2"}
TAIL = (4, 4, 64, 64)


def make_meta(n: int, rng: np.random.Generator, is_image: bool = False, fingerprints=None) -> fmt.AvatarRecord:
    """Synthetic registration output for n frames (float64 arrays, exp as [n, 21, 3]: the writer conforms them)."""
    return fmt.AvatarRecord(
        source={"path": "/data/anchor clip.mp4", "sha256": "ab" * 32, "fps": 25.0,
                "size": (np.int64(640), 360), "n_frames": n},
        fingerprints=dict(fingerprints or FP),
        crop={"scale": 2.3, "vx": 0.0, "vy": -0.125, "dsize": 512, "flag_do_rot": True},
        x_s_info={
            "pitch": rng.standard_normal((n, 66)), "yaw": rng.standard_normal((n, 66)),
            "roll": rng.standard_normal((n, 66)), "t": rng.standard_normal((n, 3)),
            "exp": rng.standard_normal((n, 21, 3)), "scale": rng.standard_normal((n, 1)),
            "kp": rng.standard_normal((n, 63)),
        },
        M_c2o=rng.standard_normal((n, 3, 3)),
        eye_open=rng.random((n, 2)),
        eye_ball=rng.random((n, 6)),
        sc=rng.standard_normal(63),
        is_image=is_image,
        random_weights=True,
    )


def write_avatar(root: Path, name: str = "ruby", n: int = 5, tail=TAIL, is_image: bool = False,
                 force: bool = False, seed: int = 0, fingerprints=None, allocate: int | None = None):
    """Write a synthetic avatar; return (dir, meta, f_s array written)."""
    rng = np.random.default_rng(seed)
    meta = make_meta(n, rng, is_image, fingerprints)
    f_s_data = rng.standard_normal((n, *tail)).astype(np.float16)
    with AvatarWriter(name, force=force, root=root) as w:
        w.open_f_s(allocate or n, tail)
        for i in range(0, n, 2):  # in batches, as registration does
            batch = f_s_data[i : i + 2]
            w.write_f_s(i, batch if i % 4 else batch.astype(np.float32))
        w.plate_path(is_image).write_bytes(rng.bytes(3000) + name.encode())
        d = w.finish(meta)
    return d, meta, f_s_data


def store_entries(root: Path) -> list[str]:
    """The names in the store's avatars/ folder, temporaries included, sorted."""
    return sorted(p.name for p in (root / "avatars").iterdir())


def snapshot(d: Path) -> dict[str, bytes]:
    """Every file of an avatar directory by name, with its bytes."""
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def read_record(d: Path) -> dict:
    """The record in the avatar's avatar.pkl, read with the restricted unpickler."""
    return safe_pickle.loads((d / "avatar.pkl").read_bytes().split(b"\n", 1)[1])


def write_record(d: Path, body: dict, version: int | None = None, crc: int | None = None) -> None:
    """Write avatar.pkl with its format line; version and crc default to the current format and the true CRC-32."""
    raw = pickle.dumps(body, protocol=5)
    version = fmt.FORMAT_VERSION if version is None else version
    crc = zlib.crc32(raw) if crc is None else crc
    (d / "avatar.pkl").write_bytes(b"ditto-fast-avatar format %d crc32 %08x\n" % (version, crc) + raw)


def reseal_record(d: Path, change) -> None:
    """Rewrite avatar.pkl with `change(body)` applied and a fresh, valid CRC-32 (a deliberate edit, not rot)."""
    raw = (d / fmt.PKL_NAME).read_bytes().partition(b"\n")[2]
    body = pickle.loads(raw)
    change(body)
    (d / fmt.PKL_NAME).write_bytes(fmt.encode_pkl(body))


@contextlib.contextmanager
def at_most(seconds: float):
    """Fail the test (instead of hanging it) if the block runs longer than `seconds`."""
    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class DyingEngine:
    """An engine handle (handles/base.py) with no engine: its renders raise what `fates` says, in turn (None: the
    render succeeds, its output named after the job's label); `restarts_fail`: how many tries to start it again fail
    first. The job driver's tests (handles/driver.py, batch's executor, serve's dispatcher)."""

    def __init__(self, fates=(), restarts_fail: int = 0, start_fails: bool = False, name: str = "engine-0"):
        from ditto_fast.handles.base import EngineState

        self.name, self.setup, self.info = name, "setup", {}
        self.fates, self.restarts_fail, self.start_fails = list(fates), restarts_fail, start_fails
        self.rendered: list[str] = []
        self._state = EngineState(self.name, "fake", state="idle")

    def start(self) -> None:
        from ditto_fast.core.errors import InputError

        if self.start_fails:
            raise InputError("engine-0: no checkpoints")

    def restart(self) -> None:
        from ditto_fast.core.errors import InputError

        self._state.restarts += 1
        if self.restarts_fail:
            self.restarts_fail -= 1
            raise InputError("engine-0: cannot start the engine process")
        self._state.state = "idle"

    def state(self):
        return self._state

    def close(self) -> None:
        self._state.state = "dead"

    def render(self, job, progress=None, commit=None):
        from ditto_fast.engine.renderer import RenderResult
        from ditto_fast.handles.base import EngineDied

        fate = self.fates.pop(0) if self.fates else None
        if isinstance(fate, EngineDied):
            self._state.state = "dead"
        if fate is not None:
            raise fate
        if progress is not None:
            progress("frames", 5, 5)
        if commit is not None:
            commit()
        self.rendered.append(job.label)
        return RenderResult(Path(f"/out/{job.label}.mp4"), {"frames": 5, "stages": {}})


def died(n: int = 1) -> list:
    """`n` deaths of an engine, for DyingEngine's fates."""
    from ditto_fast.handles.base import EngineDied

    return [EngineDied(f"engine-0 its process died (SIGKILL {k})") for k in range(n)]


# ----------------------------------------------------------------------------- a real server
class Server:
    """`ditto-fast serve` as a process on a free port, and a small HTTP client for it."""

    def __init__(self, env: dict, root: Path, *extra: str):
        self.port = free_port()
        self.log = root / f"serve-{self.port}.log"
        self.args = [sys.executable, "-m", "ditto_fast.cli", "serve", "--device", "cpu", "--port", str(self.port),
                     "--root", str(root), *extra]
        self.env = {**os.environ, **env, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        self.proc: subprocess.Popen | None = None
        self.token: str | None = None          # sent as the bearer token by call() when set (--token-file)

    def start(self) -> "Server":
        self.proc = subprocess.Popen(self.args, env=self.env, stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"),
                                     start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if self.call("GET", "/healthz")[0] == 200:
                    return self
            except OSError:
                pass
            assert self.proc.poll() is None, self.log.read_text()
            time.sleep(0.3)
        raise AssertionError("server did not start: " + self.log.read_text())

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        import urllib.error
        import urllib.request

        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {self.token}"} if self.token else {})})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def call_text(self, path: str) -> str:
        """GET `path` (200 expected): its body as text (/metrics)."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as r:
            return r.read().decode()

    def wait(self, job_id: str, states=("done", "failed", "cancelled"), timeout: float = 180,
             kind: str = "jobs") -> dict:
        """Poll /v1/{kind}/ID (a job, or a live session) until its state is one of `states`; its view."""
        key = "status" if kind == "jobs" else "state"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.call("GET", f"/v1/{kind}/{job_id}")[1]
            if job[key] in states:
                return job
            time.sleep(0.2)
        raise AssertionError(f"{kind} {job_id} still {job[key]}: " + self.log.read_text()[-3000:])

    def stop(self, sig=signal.SIGTERM) -> int:
        os.killpg(self.proc.pid, sig)
        return self.proc.wait(60)


def silent_holes(audio: np.ndarray, loud: float, quiet: float = 0.02, least: int = 16) -> tuple[np.ndarray, list[int]]:
    """The audio from its first sample above `loud` to its last, and the lengths of the runs of at least `least`
    samples under `quiet` inside it (holes of silence in a tone), shortest first."""
    above = np.flatnonzero(np.abs(audio) > loud)
    span = audio[above[0]:above[-1] + 1]
    still = (np.abs(span) < quiet).astype(np.int8)
    runs = np.diff(np.flatnonzero(np.diff(np.concatenate([[0], still, [0]]))))[::2]
    return span, sorted(int(r) for r in runs if r >= least)


def speech_clip(tmp_path: Path, name: str, seconds: float, start: float = 1.0) -> Path:
    import soundfile as sf

    audio, sr = sf.read(Path(__file__).parent / "data" / "speech_en_16k.wav", dtype="float32")
    path = tmp_path / name
    sf.write(path, audio[int(start * sr):int((start + seconds) * sr)], sr)
    return path


def wait_for_frames(server: Server, job_id: str) -> None:
    deadline = time.monotonic() + 120
    while (server.call("GET", f"/v1/jobs/{job_id}")[1]["progress"] or {}).get("stage") != "frames":
        assert time.monotonic() < deadline, server.log.read_text()[-2000:]
        time.sleep(0.1)


def window_loop_vectors(npz: str, what: str) -> tuple[dict, object]:
    """The parity file `npz` (`sampler_seed0.npz`, `online_seed0.npz`: `what` it holds) as a dict, and the fake LMDM
    that made it (skips the test when ../shared is absent)."""
    import importlib.util

    import pytest
    from conftest import PARITY as parity

    if not (parity / npz).exists():
        pytest.skip(f"{what} not found at {parity}")
    spec = importlib.util.spec_from_file_location("parity_fake_lmdm", parity / "fake_lmdm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with np.load(parity / npz) as z:
        return {k: z[k] for k in z.files}, mod.fake_lmdm


def fake_window_sampler(fake_lmdm, params: dict):
    """A window sampler (torch in, torch out, generator ignored) that runs the parity files' fake LMDM."""
    import torch

    return lambda cond_frame, cond, gen: torch.from_numpy(fake_lmdm(params, cond_frame.numpy(), cond.numpy()))


def together(n: int, call) -> dict:
    """`call(i)` for i in range(n), each on a thread of its own, all let go at once; {i: what it returned}."""
    import threading

    got: dict = {}
    gate = threading.Barrier(n)

    def one(i: int) -> None:
        gate.wait()
        got[i] = call(i)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def without_root_powers() -> None:
    """In a child before exec (a subprocess's preexec_fn): drop the capabilities that let root read and write any
    file (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH) from the bounding set, so that the program it runs obeys file modes
    as root (CI runs as root); exit 99 where root here cannot drop them."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):                                  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:          # PR_CAPBSET_DROP
            os._exit(99)
