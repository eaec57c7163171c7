"""Hostile inputs (the third probe): side files that would overwrite inputs, files that never end or block, YAML
alias bombs, deep or huge job lines, and messages that name what is really wrong."""

from __future__ import annotations

import json
import os
import shutil
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import store_env
from hostile import alias_bomb


class _Deadline(Exception):
    pass


@contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging the suite) when the block blocks or runs past `seconds`."""
    def expire(signum, frame):
        raise _Deadline(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _snapshot(paths):
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in paths}


def test_side_files_never_replace_an_input_or_an_output(video_avatar, session_home, tiny_checkpoints, clips,
                                                        tmp_path, run_cli):
    audio = shutil.copy(clips[0], tmp_path / "a.wav")
    audio = Path(audio)
    done = tmp_path / "done.mp4"
    done.write_bytes(b"an earlier delivery")
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"avatar": "anchor", "audio": str(audio), "output": str(done)}) + "\n")
    config = tmp_path / "house.yaml"
    config.write_text("motion:\n  steps: 2\n")
    watched = [audio, done, jobs, config]
    before = _snapshot(watched)
    listing = sorted(p.name for p in tmp_path.iterdir())
    env = store_env(session_home, tiny_checkpoints)
    render = ["render", "--avatar", "anchor", "--audio", str(audio), "--device", "cpu", "--quiet",
              "--config", str(config)]
    cases = [
        [*render, "-o", str(tmp_path / "x.mp4"), "--timings", str(audio)],
        [*render, "-o", str(tmp_path / "x.mp4"), "--timings", str(tmp_path / "x.mp4")],
        [*render, "-o", str(tmp_path / "x.mp4"), "--timings", str(config)],
        [*render, "-o", str(tmp_path / "x.mp4"), "--timings", str(video_avatar / "t.json")],
        ["batch", str(jobs), "--report", str(jobs), "--device", "cpu", "--quiet"],
        ["batch", str(jobs), "--report", str(audio), "--device", "cpu", "--quiet"],
        ["batch", str(jobs), "--report", str(done), "--device", "cpu", "--quiet"],
        ["batch", str(jobs), "--report", str(config), "--config", str(config), "--device", "cpu", "--quiet"],
    ]
    for args in cases:
        r = run_cli(args, env)
        assert r.returncode == 2, (args, r.stderr)
        assert "would overwrite an input" in r.stderr or "both the" in r.stderr or "output of job 0" in r.stderr, \
            (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert _snapshot(watched) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == listing
    assert not (video_avatar / "t.json").exists()


def test_the_timings_file_is_written_atomically_beside_a_render(tmp_path):
    from ditto_fast.media.outputs import write_json

    target = tmp_path / "t.json"
    write_json(target, {"a": 1})
    write_json(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]


@pytest.fixture()
def fifo(tmp_path):
    """A named pipe nobody writes to (opening it for reading blocks forever)."""
    def make(name: str) -> Path:
        path = tmp_path / name
        os.mkfifo(path)
        return path
    return make


def test_files_that_never_end_or_block_are_refused_at_once(video_avatar, session_home, tiny_checkpoints, clips,
                                                          tmp_path, fifo, run_cli):
    env = store_env(session_home, tiny_checkpoints)
    render = ["render", "--avatar", "anchor", "--audio", str(clips[0]), "-o", str(tmp_path / "o.mp4"),
              "--device", "cpu", "--quiet"]
    cases = [
        ([*render, "--controls", "/dev/zero"], "/dev/zero: is a device"),
        ([*render, "--controls", str(fifo("c.json"))], "c.json: is a FIFO"),
        ([*render, "--emotion", str(fifo("e.json"))], "e.json: is a FIFO"),
        ([*render, "--config", str(fifo("h.yaml"))], "h.yaml: is a FIFO"),
        ([*render, "--delivery", str(fifo("p.yaml"))], "p.yaml: is a FIFO"),
        (["batch", "/dev/zero", "--device", "cpu", "--quiet"], "/dev/zero: is a device"),
        (["batch", str(fifo("j.jsonl")), "--device", "cpu", "--quiet"], "j.jsonl: is a FIFO"),
        (["config", "--config", "/dev/zero"], "/dev/zero: is a device"),
    ]
    for args, said in cases:
        with deadline(20):
            r = run_cli(args, env)
        assert r.returncode == 3 and said in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(17 << 20)                      # sparse: more than any control file can be
    r = run_cli([*render, "--controls", str(big)], env)
    assert r.returncode == 3 and "more than a JSON control file can be" in r.stderr, r.stderr


def test_audio_that_is_a_folder_a_fifo_or_a_device_is_named_as_such(video_avatar, session_home, tiny_checkpoints,
                                                                     tmp_path, fifo, run_cli):
    env = store_env(session_home, tiny_checkpoints)
    folder = tmp_path / "wavs"
    folder.mkdir()
    for audio, out, said in ((folder, folder / "o.mp4", "is a directory"), (fifo("a.wav"), None, "is a FIFO"),
                             (Path("/dev/zero"), None, "is a device")):
        with deadline(20):
            r = run_cli(["render", "--avatar", "anchor", "--audio", str(audio), "-o", str(out or tmp_path / "o.mp4"),
                         "--device", "cpu", "--quiet"], env)
        assert r.returncode == 3 and said in r.stderr and "empty" not in r.stderr, r.stderr


def test_yaml_alias_bombs_are_refused_before_they_expand(tmp_path, run_cli, clips):
    config = tmp_path / "bomb.yaml"
    config.write_text(alias_bomb("render:\n  crf: *i\n"))
    with deadline(20):
        r = run_cli(["config", "--config", str(config)])
    assert r.returncode == 2 and "aliases" in r.stderr and len(r.stderr) < 400, r.stderr[:400]
    profile = tmp_path / "house.yaml"
    shipped = (Path(__file__).parents[1] / "configs" / "delivery" / "web-h264.yaml").read_text()
    profile.write_text(alias_bomb(shipped.replace("container: mp4", "container: *i", 1)))
    with deadline(20):
        r = run_cli(["qc", str(clips[0]), "--delivery", str(profile)])
    assert r.returncode == 2 and "aliases" in r.stderr and len(r.stderr) < 400, r.stderr[:400]


def test_one_hostile_job_line_is_one_failed_job(session_home, tiny_checkpoints, clips, tmp_path, run_cli):
    jobs = tmp_path / "jobs.jsonl"
    deep = "[" * 100_000 + "]" * 100_000
    huge = json.dumps({"avatar": "anchor", "audio": str(clips[0]), "output": "h.mp4", "emotion": "x" * 5_000_000})
    odd = json.dumps({"avatar": "anchor", "audio": str(tmp_path / "new\nline.wav"), "output": "n.mp4"})
    grumpy = json.dumps({"avatar": "nobody", "audio": str(clips[0]), "output": "g.mp4", "emotion": "grumpy"})
    jobs.write_text("\n".join([deep, huge, odd, grumpy]) + "\n")
    report = tmp_path / "report.json"
    with deadline(60):
        r = run_cli(["batch", str(jobs), "--report", str(report), "--device", "cpu"],
                    store_env(session_home, tiny_checkpoints))
    assert r.returncode == 7, r.stderr[-2000:]
    rows = json.loads(report.read_text())["jobs"]
    assert [row["status"] for row in rows] == ["failed"] * 4
    assert "nested too deep" in rows[0]["error"]
    assert all(len(row["error"]) <= 2000 and "\n" not in row["error"] for row in rows)
    assert all(row["error"].startswith(f"{jobs}:{n}:") for n, row in enumerate(rows, 1)), [r["error"] for r in rows]
    assert len(r.stderr) < 20_000
    table = [line for line in r.stderr.splitlines() if line.lstrip()[:1].isdigit()]
    assert len(table) == 4, r.stderr        # the newline in a file name does not split the job table


def test_an_emotion_error_in_a_batch_names_its_job_line(video_avatar, session_home, tiny_checkpoints, clips,
                                                        tmp_path, run_cli):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"avatar": "anchor", "audio": str(clips[0]), "output": "g.mp4",
                                "emotion": "grumpy"}) + "\n")
    r = run_cli(["batch", str(jobs), "--device", "cpu"], store_env(session_home, tiny_checkpoints))
    assert r.returncode == 7 and f"{jobs}:1: unknown emotion 'grumpy'" in r.stderr, r.stderr
