"""`ditto-fast render` end to end with tiny random checkpoints on synthetic anchors."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import imageio_ffmpeg
import numpy as np
import pytest

from conftest import REPO, store_env
from ditto_fast.avatar import load_avatar
from ditto_fast.media.timeline import mirror_indices
from ditto_fast.render.putback import crop_bbox
from synthetic import Motion, astronaut_canvas

SPEECH_2S = REPO / "tests" / "data" / "speech_en_44k_stereo_2s.wav"   # 1.99 s, 44.1 kHz stereo -> 50 frames


def cli(args: list[str], home: Path, ckpt: Path, cwd: Path | None = None, timeout: int = 600):
    """`ditto-fast ARGS` in a new process (the end-to-end tests; the error cases use `run_cli`)."""
    return subprocess.run([sys.executable, "-m", "ditto_fast.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ, **store_env(home, ckpt)), cwd=cwd, timeout=timeout)


def decode(path: Path) -> np.ndarray:
    gen = imageio_ffmpeg.read_frames(str(path))
    meta = next(gen)
    w, h = meta["size"]
    return np.stack([np.frombuffer(f, np.uint8).reshape(h, w, 3) for f in gen])


def audio_seconds(path: Path) -> float:
    err = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-i", str(path), "-map", "0:a", "-f", "null", "-"],
                         capture_output=True, text=True).stderr
    times = re.findall(r"time=(\d+):(\d+):([\d.]+)", err)
    h, m, s = times[-1]
    assert "Audio: aac" in err
    return int(h) * 3600 + int(m) * 60 + float(s)


@pytest.fixture(scope="module")
def rendered(video_avatar, session_home, tiny_checkpoints, tmp_path_factory):
    out = tmp_path_factory.mktemp("render")
    runs = {}
    for tag, seed in (("a", 0), ("b", 0), ("c", 1)):
        r = cli(["render", "--avatar", "anchor", "--audio", str(SPEECH_2S), "-o", str(out / f"{tag}.mp4"),
                 "--seed", str(seed), "--timings", str(out / f"{tag}.json"), "--quiet"], session_home,
                tiny_checkpoints)
        assert r.returncode == 0, r.stderr
        runs[tag] = out / f"{tag}.mp4"
    return runs


@pytest.mark.slow
def test_output_frames_size_and_audio(rendered):
    frames = decode(rendered["a"])
    assert frames.shape == (50, 1080, 1920, 3)
    assert abs(audio_seconds(rendered["a"]) - 2.0) <= 0.05
    timings = json.loads(rendered["a"].with_suffix(".json").read_text())
    assert timings["frames"] == 50 and timings["random_weights"] is True and timings["steps"] == 25
    assert set(timings["stages"]) == {"load_models", "load_avatar", "audio_features", "motion", "stitch", "render",
                                      "putback", "write"}
    assert set(timings["stages_cpu"]) == set(timings["stages"])
    assert all(timings["stages_cpu"][k] <= timings["stages"][k] + 0.05 for k in ("stitch", "putback", "write"))
    assert timings["stages_cpu"]["putback"] > 0 and timings["stages_cpu"]["stitch"] > 0
    assert timings["encoder"] == "libx264" and timings["batch_size"] == 1 and timings["rate"] == "25"
    assert not list(rendered["a"].parent.glob(".*part*"))


@pytest.mark.slow
def test_background_outside_face_is_the_plate(rendered, video_avatar):
    av = load_avatar(video_avatar)
    out = decode(rendered["a"]).astype(np.int16)
    plate = decode(av.plate_path).astype(np.int16)
    idx = mirror_indices(out.shape[0], av.n_frames)
    changed_inside = 0.0
    for i in list(range(0, out.shape[0], 7)) + [out.shape[0] - 1]:
        x0, y0, x1, y1 = crop_bbox(av.M_c2o[idx[i]], 512, out.shape[1:3])
        outside = np.ones(out.shape[1:3], bool)
        outside[max(0, y0 - 16):y1 + 16, max(0, x0 - 16):x1 + 16] = False
        err = {k: np.abs(out[i] - plate[k])[outside].mean() for k in range(av.n_frames)}
        assert err[idx[i]] < 2.0, (i, err[idx[i]])                  # codec tolerance (two H.264 passes)
        assert min(err, key=err.get) == idx[i], (i, idx[i], min(err, key=err.get))   # and the right frame
        changed_inside = max(changed_inside, np.abs(out[i] - plate[idx[i]])[y0:y1, x0:x1].mean())
    assert changed_inside > 5       # the face region was replaced by the (random-weight) render


@pytest.mark.slow
def test_same_seed_same_video_other_seed_differs(rendered):
    a, b, c = (decode(rendered[k]) for k in "abc")
    assert np.array_equal(a, b)
    assert np.abs(a.astype(np.int16) - c).max() > 20


@pytest.mark.register
@pytest.mark.slow
def test_image_avatar(tmp_path, tiny_checkpoints):
    img = astronaut_canvas(0, Motion.for_face(140, center=(480, 400)), size=(960, 540))
    cv2.imwrite(str(tmp_path / "still.png"), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
    home = tmp_path / "home"
    assert cli(["register", str(tmp_path / "still.png"), "--name", "still", "--quiet"], home,
               tiny_checkpoints).returncode == 0
    r = cli(["render", "--avatar", "still", "--audio", str(SPEECH_2S), "--quiet"], home, tiny_checkpoints,
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "still_speech_en_44k_stereo_2s.mp4"       # the default output name
    assert r.stdout.strip() == str(out)
    frames = decode(out)
    assert frames.shape == (50, 540, 960, 3)
    assert np.abs(frames[0].astype(np.int16) - frames[25]).max() > 0     # the face moves


def _one_error_line(r) -> str:
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ditto-fast: error:"), r.stderr
    return lines[0]


def test_bad_inputs(video_avatar, session_home, tiny_checkpoints, tmp_path, run_cli):
    env = store_env(session_home, tiny_checkpoints)
    base = ["render", "--avatar", "anchor", "--audio", str(SPEECH_2S), "--quiet"]
    r = run_cli(["render", "--avatar", "nobody", "--audio", str(SPEECH_2S)], env)
    assert r.returncode == 5 and "anchor" in _one_error_line(r)            # lists what exists
    r = run_cli(base + ["-o", str(tmp_path)], env)
    assert r.returncode == 3 and "directory" in _one_error_line(r)
    r = run_cli(base + ["-o", str(tmp_path / "missing_dir" / "x.mp4")], env)
    assert r.returncode == 3
    r = run_cli(base + ["-o", str(tmp_path / "x.mp4"), "--checkpoints", str(tmp_path / "none")], env)
    assert r.returncode == 6 and "init-random" in _one_error_line(r)
    (tmp_path / "bad.wav").write_text("not audio")
    r = run_cli(["render", "--avatar", "anchor", "--audio", str(tmp_path / "bad.wav"), "-o", str(tmp_path / "x.mp4")],
                env)
    assert r.returncode == 3 and "bad.wav" in _one_error_line(r)
    r = run_cli(base + ["--steps", "0"], env)
    assert r.returncode == 2
    assert not list(tmp_path.glob("*.mp4")) and not list(tmp_path.glob(".*part*"))


def test_avatar_from_other_checkpoints_is_refused(video_avatar, session_home, tmp_path, run_cli):
    from ditto_fast.checkpoints.random_weights import write_random

    other = tmp_path / "other"
    write_random(other, tiny=True, seed=5)
    r = run_cli(["render", "--avatar", "anchor", "--audio", str(SPEECH_2S), "-o", str(tmp_path / "x.mp4")],
                store_env(session_home, other))
    assert r.returncode == 5 and "re-register" in _one_error_line(r)
    assert not (tmp_path / "x.mp4").exists()



@pytest.mark.slow
def test_nan_in_the_middle_frames_of_f_s_is_exit_5_with_nothing_written(video_avatar, tiny_checkpoints, tmp_path,
                                                                       run_cli):
    """Bytes overwritten with NaN in two middle frames of f_s.npy (which the check at open, first and last frame
    only, does not read): the render stops at the first of them, exit 5, and delivers nothing."""
    import shutil

    home = tmp_path / "home"
    shutil.copytree(video_avatar, home / "avatars" / "anchor")
    f_s = np.load(home / "avatars" / "anchor" / "f_s.npy", mmap_mode="r+")
    mid = len(f_s) // 2
    for i in (mid, mid + 1):
        f_s[i].reshape(-1)[f_s[i].size // 2 : f_s[i].size // 2 + 256] = np.nan
    f_s.flush()
    del f_s
    out = tmp_path / "out" / "x.mp4"
    out.parent.mkdir()
    r = run_cli(["render", "--avatar", "anchor", "--audio", str(SPEECH_2S), "-o", str(out), "--quiet"],
                store_env(home, tiny_checkpoints))
    line = _one_error_line(r)
    assert r.returncode == 5 and f"f_s.npy fails its checksum at frame {mid};" in line, line
    assert "`ditto-fast avatars show anchor --verify`" in line and "re-register" in line
    assert list(out.parent.iterdir()) == []

def _broken_copy(tiny_checkpoints: Path, dest: Path, name: str, damage: str) -> Path:
    """A copy of the tiny checkpoints whose `name`.pth is cut in half or has its middle overwritten; its path."""
    import shutil

    shutil.copytree(tiny_checkpoints, dest)
    path = dest / "ditto_pytorch" / "models" / f"{name}.pth"
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[:len(data) // 2]
    else:
        middle = len(data) // 2
        data[middle:middle + 4096] = b"\xff" * 4096
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("name,damage", [("appearance_extractor", "truncated"), ("motion_extractor", "truncated"),
                                         ("motion_extractor", "overwritten")])
def test_a_broken_extractor_file_is_a_checkpoint_error_not_a_stale_avatar(video_avatar, session_home,
                                                                          tiny_checkpoints, tmp_path, run_cli, name,
                                                                          damage):
    """The avatar was made with the good files; a damaged copy of one differs in fingerprint, but it is the file
    that is wrong (exit 6, naming it), not the avatar (exit 5, "re-register")."""
    broken = _broken_copy(tiny_checkpoints, tmp_path / "ckpt", name, damage)
    out = tmp_path / "x.mp4"
    env = store_env(session_home, tmp_path / "ckpt")
    r = run_cli(["render", "--avatar", "anchor", "--audio", str(SPEECH_2S), "-o", str(out), "--quiet"], env)
    line = _one_error_line(r)
    assert r.returncode == 6 and f"error: {broken}: " in line and "re-register" not in line, line
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"avatar": "anchor", "audio": str(SPEECH_2S), "output": str(out)}) + "\n")
    r = run_cli(["batch", str(jobs), "--quiet", "--report", str(tmp_path / "r.json")], env)
    row, = json.loads((tmp_path / "r.json").read_text())["jobs"]
    assert r.returncode == 7 and row["exit_code"] == 6, row
    assert row["error"] == f"{jobs}:1: " + line.split("error: ", 1)[1]
    assert not out.exists()


def test_a_checkpoint_file_that_cannot_be_read_is_a_checkpoint_error(video_avatar, session_home, tiny_checkpoints,
                                                                     tmp_path, run_cli):
    """Reading the files for their fingerprints fails (here HuBERT's weights are a folder): exit 6 naming the
    file, not an internal error."""
    import shutil

    shutil.copytree(tiny_checkpoints, tmp_path / "ckpt")
    weights = tmp_path / "ckpt" / "hubert-large-ls960-ft" / "model.safetensors"
    weights.unlink()
    weights.mkdir()
    r = run_cli(["render", "--avatar", "anchor", "--audio", str(SPEECH_2S), "-o", str(tmp_path / "x.mp4")],
                store_env(session_home, tmp_path / "ckpt"))
    assert r.returncode == 6 and f"error: {weights}: cannot read the checkpoint file" in _one_error_line(r), r.stderr


def _render_process(out: Path, home: Path, ckpt: Path) -> subprocess.Popen:
    env = dict(os.environ, **store_env(home, ckpt))
    return subprocess.Popen([sys.executable, "-m", "ditto_fast.cli", "render", "--avatar", "anchor", "--audio",
                             str(SPEECH_2S), "-o", str(out), "--device", "cpu", "--quiet"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.02)


@pytest.mark.slow
def test_two_renders_of_one_output_one_writes_the_other_fails_fast(video_avatar, session_home, tiny_checkpoints,
                                                                   tmp_path):
    """Two `ditto-fast render -o same.mp4` at once: the first claims the output before its networks load; the
    second, started while the first is held stopped, fails at once naming the first's pid; the first completes."""
    out = tmp_path / "same.mp4"
    first = _render_process(out, session_home, tiny_checkpoints)
    try:
        _wait_for(tmp_path / ".same.mp4.claim", first)
        first.send_signal(signal.SIGSTOP)                   # it holds the claim and makes no progress
        t0 = time.time()
        second = _render_process(out, session_home, tiny_checkpoints)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 3, err
        assert err.strip() == (f"ditto-fast: error: {out}: is being written by another process (pid {first.pid}); "
                               "wait for it to finish or choose another output path")
        assert time.time() - t0 < 60 and not out.exists()
    finally:
        first.send_signal(signal.SIGCONT)
    stdout, err = first.communicate(timeout=600)
    assert first.returncode == 0 and stdout.strip() == str(out), err
    assert decode(out).shape[0] == 50
    assert [p.name for p in tmp_path.iterdir()] == ["same.mp4"]      # the claim went with its render


@pytest.mark.slow
def test_a_killed_renders_claim_blocks_nobody(video_avatar, session_home, tiny_checkpoints, tmp_path):
    out = tmp_path / "same.mp4"
    first = _render_process(out, session_home, tiny_checkpoints)
    _wait_for(tmp_path / ".same.mp4.claim", first)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=60)
    assert (tmp_path / ".same.mp4.claim").read_text() == f"{first.pid}\n"     # left behind, unlocked
    second = _render_process(out, session_home, tiny_checkpoints)
    _, err = second.communicate(timeout=600)
    assert second.returncode == 0, err
    assert decode(out).shape[0] == 50 and not list(tmp_path.glob(".*.claim"))

@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_leaves_nothing(sig, code, video_avatar, session_home, tiny_checkpoints, tmp_path, speech_wav):
    env = dict(os.environ, **store_env(session_home, tiny_checkpoints))
    out = tmp_path / "x.mp4"
    p = subprocess.Popen([sys.executable, "-m", "ditto_fast.cli", "render", "--avatar", "anchor", "--audio",
                          str(speech_wav), "-o", str(out)], stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 120
    while time.time() < deadline and not list(tmp_path.glob(".*part*")):
        time.sleep(0.1)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.slow
def test_disk_full_leaves_no_partial_file(video_avatar, session_home, tiny_checkpoints, tmp_path):
    # the encoder (the ffmpeg reading frames on stdin) may write 200 kB: the output's disk fills part way
    real = imageio_ffmpeg.get_ffmpeg_exe()
    wrapper = tmp_path.parent / f"{tmp_path.name}-ffmpeg"
    wrapper.write_text(f"#!{sys.executable}\nimport os, resource, signal, sys\n"
                       "if 'pipe:0' in sys.argv:\n"
                       "    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))\n"
                       "    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
                       f"os.execv({real!r}, [{real!r}, *sys.argv[1:]])\n")
    wrapper.chmod(0o755)
    env = dict(os.environ, **store_env(session_home, tiny_checkpoints), IMAGEIO_FFMPEG_EXE=str(wrapper))
    out = tmp_path / "x.mp4"
    r = subprocess.run([sys.executable, "-m", "ditto_fast.cli", "render", "--avatar", "anchor", "--audio",
                        str(SPEECH_2S), "-o", str(out), "--quiet"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 3 and "writing" in _one_error_line(r)
    assert not out.exists() and not list(tmp_path.iterdir())
