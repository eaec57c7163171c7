"""Exit codes and the one line (README "Exit codes"): click's own checks of option values, named inputs that are
missing or unreadable (exit 3), folders and names where a file to write belongs, init-random's folder, --emotion
naming a folder, and the first failure of a quiet batch."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import store_env
from support import without_root_powers


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ditto-fast: error: "), stderr
    return lines[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- click's checks, one line
@pytest.mark.parametrize("args, said", [
    (["render", "--avatar", "a", "--audio", "x.wav", "--seed", "-1"], "--seed: must be in 0..9223372036854775807"),
    (["render", "--avatar", "a", "--audio", "x.wav", "--steps", "0"], "--steps: must be in 1..1000"),
    (["render", "--avatar", "a", "--audio", "x.wav", "--crf", "99"], "--crf: must be in 0..51"),
    (["serve", "--port", "0"], "--port: 0 is not in the range 1<=x<=65535"),
    (["render", "--avatar", "a", "--audio", "x.wav", "--precision", "fp8"], "--precision: 'fp8' is not one of"),
    (["render", "--bogus"], "No such option '--bogus'"),
    (["nonsense"], "No such command 'nonsense'"),
    (["checkpoints", "init-random"], "Missing argument 'DIRECTORY'"),
])
def test_a_bad_value_click_checks_is_one_line(args, said, tmp_path, run_cli):
    r = run_cli(args, {"DITTO_FAST_HOME": str(tmp_path)})
    line = _one_error_line(r.stderr)
    assert r.returncode == 2 and said in line, r.stderr
    assert "Usage:" not in r.stderr and r.stdout == ""


def test_a_bare_group_still_shows_its_help(run_cli):
    r = run_cli(["checkpoints"])
    assert "init-random" in r.stdout + r.stderr and "Usage:" in r.stdout + r.stderr


# ----------------------------------------------------------------------------- named inputs: missing is 3
def test_a_missing_named_input_is_exit_3_in_one_line(tmp_path, run_cli):
    env = {"DITTO_FAST_HOME": str(tmp_path / "home")}
    gone = tmp_path / "gone"
    cases = [
        (["render", "--avatar", "a", "--audio", "x.wav", "--config", f"{gone}.yaml"], f"{gone}.yaml: file not found"),
        (["config", "--config", f"{gone}.yaml"], f"{gone}.yaml: file not found"),
        (["batch", f"{gone}.jsonl"], f"{gone}.jsonl: file not found"),
        (["serve", "--token-file", f"{gone}.token", "--port", str(_free_port())], f"{gone}.token: file not found"),
        (["qc", f"{gone}.mxf", "--delivery", f"{gone}.yaml"], f"{gone}.yaml: delivery profile not found"),
    ]
    (tmp_path / "jobs").mkdir()
    cases.append((["batch", str(tmp_path / "jobs")], f"{tmp_path / 'jobs'}: is a directory"))
    for args, said in cases:
        r = run_cli(args, env)
        assert r.returncode == 3 and said in _one_error_line(r.stderr), (args, r.stderr)


# ----------------------------------------------------------------------------- named inputs: unreadable is 3
@pytest.fixture()
def bound_by_modes(tmp_path):
    """run(args, env, unreadable=[paths]) -> CompletedProcess: `ditto-fast ARGS` as a process that file modes bind,
    the files `unreadable` at mode 000 meanwhile (as root: without root's power to read any file)."""
    root = os.geteuid() == 0
    if root:
        probe = subprocess.run([sys.executable, "-c", "pass"], preexec_fn=without_root_powers)
        if probe.returncode == 99:
            pytest.skip("root here cannot drop CAP_DAC_OVERRIDE (no CAP_SETPCAP), so no file is unreadable to it")

    def run(args: list, env: dict, unreadable: list[Path] = ()) -> subprocess.CompletedProcess:
        modes = {p: p.stat().st_mode for p in unreadable}
        for p in unreadable:
            p.chmod(0)
        try:
            return subprocess.run([sys.executable, "-m", "ditto_fast.cli", *map(str, args)], capture_output=True,
                                  text=True, env={**os.environ, **env}, cwd=tmp_path, timeout=300,
                                  preexec_fn=without_root_powers if root else None)
        finally:
            for p, mode in modes.items():
                p.chmod(mode)

    return run


@pytest.mark.slow
def test_an_unreadable_named_input_is_exit_3_in_one_line(bound_by_modes, video_avatar, session_home,
                                                         tiny_checkpoints, clips, anchor_video, tmp_path):
    env = store_env(session_home, tiny_checkpoints)
    audio, anchor = shutil.copy(clips[0], tmp_path / "speech.wav"), shutil.copy(anchor_video, tmp_path / "a.mp4")
    (tmp_path / "controls.json").write_text('{"default": {"yaw": 2}}')
    (tmp_path / "house.yaml").write_text("motion:\n  steps: 2\n")
    (tmp_path / "jobs.jsonl").write_text(json.dumps({"avatar": "anchor", "audio": str(audio)}) + "\n")
    (tmp_path / "token").write_text("0123456789abcdef0123456789abcdef\n")
    render = ["render", "--avatar", "anchor", "--audio", audio, "--device", "cpu", "--quiet", "-o", tmp_path / "o.mp4"]
    cases = [
        (render, audio),
        ([*render, "--controls", tmp_path / "controls.json"], tmp_path / "controls.json"),
        ([*render, "--config", tmp_path / "house.yaml"], tmp_path / "house.yaml"),
        (["register", anchor, "--name", "other", "--device", "cpu"], anchor),
        (["qc", anchor], anchor),
        (["batch", tmp_path / "jobs.jsonl", "--device", "cpu"], tmp_path / "jobs.jsonl"),
        (["serve", "--token-file", tmp_path / "token", "--port", _free_port()], tmp_path / "token"),
    ]
    for args, unreadable in cases:
        r = bound_by_modes(args, env, [Path(unreadable)])
        line = _one_error_line(r.stderr)
        assert r.returncode == 3, (args, r.stderr)
        assert line.startswith(f"ditto-fast: error: {unreadable}: cannot read the file (permission denied); check "
                               "its permissions"), (args, line)
    assert not (tmp_path / "o.mp4").exists() and not (session_home / "avatars" / "other").exists()


@pytest.mark.slow
def test_init_random_into_a_folder_it_cannot_write_is_exit_3(bound_by_modes, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        r = bound_by_modes(["checkpoints", "init-random", locked / "ck", "--tiny"], {})
    finally:
        locked.chmod(0o755)
    line = _one_error_line(r.stderr)
    assert r.returncode == 3 and f"{locked / 'ck'}: cannot write the checkpoints there (Permission denied)" in line
    assert list(locked.iterdir()) == []


def test_init_random_under_a_file_is_exit_3(tmp_path, run_cli):
    (tmp_path / "a-file").write_text("x")
    for target, said in ((tmp_path / "a-file" / "ck", f"{tmp_path / 'a-file'} is a file, not a folder"),
                         (tmp_path / "a-file", "a-file: is a file, not a folder")):
        r = run_cli(["checkpoints", "init-random", target, "--tiny"])
        assert r.returncode == 3 and said in _one_error_line(r.stderr), r.stderr


def test_init_random_on_a_read_only_disk_is_exit_3(tmp_path, run_cli, monkeypatch):
    """A read-only mount needs privileges a test does not have: the disk's answer (EROFS) comes from mkdir."""
    import errno

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    r = run_cli(["checkpoints", "init-random", tmp_path / "ck", "--tiny"])
    assert r.returncode == 3 and "cannot write the checkpoints there (Read-only file system)" in \
        _one_error_line(r.stderr)


# ----------------------------------------------------------------------------- files to write
def test_output_names_too_long_for_the_disk_are_exit_3(video_avatar, session_home, tiny_checkpoints, clips,
                                                       tmp_path, run_cli):
    env = store_env(session_home, tiny_checkpoints)
    render = ["render", "--avatar", "anchor", "--audio", clips[0], "--device", "cpu", "--quiet"]
    long_name = tmp_path / ("n" * 300 + ".mp4")
    deep = tmp_path.joinpath(*["d" * 200] * 21, "x.mp4")
    cases = [([*render, "-o", long_name], "a name in the path is 304 bytes, more than the 255"),
             ([*render, "-o", deep], "bytes, more than the 4095 the system allows"),
             ([*render, "-o", tmp_path / "x.mp4", "--timings", tmp_path / ("t" * 300 + ".json")], "is 305 bytes"),
             ([*render, "-o", tmp_path / "x.mp4", "--preview", tmp_path / ("p" * 300 + ".png")], "is 304 bytes")]
    for args, said in cases:
        r = run_cli(args, env)
        assert r.returncode == 3 and said in _one_error_line(r.stderr), (args[-1], r.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_folder_given_for_a_json_file_is_told_a_json_name(video_avatar, session_home, tiny_checkpoints, clips,
                                                            tmp_path, run_cli):
    env = store_env(session_home, tiny_checkpoints)
    folder = tmp_path / "side"
    folder.mkdir()
    r = run_cli(["render", "--avatar", "anchor", "--audio", clips[0], "-o", tmp_path / "x.mp4", "--device", "cpu",
                 "--timings", folder], env)
    assert r.returncode == 3 and f"give a file name such as {folder / 'timings.json'}" in _one_error_line(r.stderr)
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"avatar": "anchor", "audio": str(clips[0]), "output": str(tmp_path / "y.mp4")}) + "\n")
    r = run_cli(["batch", jobs, "--device", "cpu", "--report", folder], env)
    assert r.returncode == 3 and f"give a file name such as {folder / 'report.json'}" in _one_error_line(r.stderr)
    assert not (tmp_path / "x.mp4").exists() and not (tmp_path / "y.mp4").exists()


# ----------------------------------------------------------------------------- --emotion, a quiet batch
def test_an_emotion_naming_a_folder_is_exit_3(video_avatar, session_home, tiny_checkpoints, clips, tmp_path,
                                              run_cli, monkeypatch):
    env = store_env(session_home, tiny_checkpoints)
    render = ["render", "--avatar", "anchor", "--audio", clips[0], "-o", tmp_path / "x.mp4", "--device", "cpu"]
    folder = tmp_path / "moods"
    folder.mkdir()
    r = run_cli([*render, "--emotion", folder], env)
    assert r.returncode == 3 and f"{folder}: is a directory; give an emotion schedule" in _one_error_line(r.stderr)
    (tmp_path / "happy").mkdir()                 # a folder named like a label does not hide the label
    monkeypatch.chdir(tmp_path)
    from ditto_fast.motion.conditions import schedule_file

    assert schedule_file("happy") is None and schedule_file(str(folder)) == folder


def test_a_quiet_batch_names_its_first_failure(video_avatar, session_home, tiny_checkpoints, tmp_path, run_cli):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"avatar": "anchor", "audio": str(tmp_path / f"gone{i}.wav"),
                                        "output": str(tmp_path / f"{i}.mp4")}) + "\n" for i in range(2)))
    r = run_cli(["batch", jobs, "--device", "cpu", "--quiet"], store_env(session_home, tiny_checkpoints))
    assert r.returncode == 7 and r.stdout.strip() == "done 0, skipped 0, failed 2", r.stdout
    line = _one_error_line(r.stderr)
    assert line.startswith("ditto-fast: error: job 0 failed (and 1 more): ") and "gone0.wav: file not found" in line \
        and line.endswith("(exit 3)"), line
