"""The small commands: avatars (list/show/rm, --json), doctor, usage errors and exit codes.

All but the last run in this process through `cli.main` (the `run_cli` fixture): same exit codes and
stderr lines as a real process, without its start-up time. The last runs the command as a process.
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import store_env

from ditto_fast.cli import main


def test_avatars_list_show_rm(video_avatar, session_home, tmp_path, run_cli):
    env = {"DITTO_FAST_HOME": str(session_home)}
    r = run_cli(["avatars", "--json"], env)
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["anchor"]["frames"] == 25 and rows["anchor"]["resolution"] == "1920x1080"
    assert rows["anchor"]["random_weights"] is True and rows["anchor"]["size_bytes"] > 0
    r = run_cli(["avatars"], env)
    assert r.returncode == 0 and "anchor" in r.stdout and "random weights" in r.stdout
    r = run_cli(["avatars", "show", "anchor"], env)
    assert r.returncode == 0 and json.loads(r.stdout)["name"] == "anchor"
    r = run_cli(["avatars", "show", "nobody"], env)
    assert r.returncode == 5 and "anchor" in r.stderr          # says what exists
    # rm on a copy of the store, so the session's avatar stays for other tests
    import shutil

    copy = tmp_path / "home"
    shutil.copytree(session_home, copy)
    env = {"DITTO_FAST_HOME": str(copy)}
    assert run_cli(["avatars", "rm", "anchor"], env).returncode == 0
    assert not (copy / "avatars" / "anchor").exists()
    assert run_cli(["avatars", "rm", "anchor"], env).returncode == 5


def test_empty_store_message(tmp_path, run_cli):
    r = run_cli(["avatars"], {"DITTO_FAST_HOME": str(tmp_path)})
    assert r.returncode == 0 and "ditto-fast register" in r.stdout


def test_doctor_reports_each_check(tiny_checkpoints, tmp_path, run_cli):
    r = run_cli(["doctor", "--checkpoints", str(tiny_checkpoints)], {"DITTO_FAST_HOME": str(tmp_path)})
    lines = r.stdout.strip().splitlines()
    names = [ln.split()[1] for ln in lines]
    assert names == ["ffmpeg", "torch", "mediapipe", "checkpoints", "store"], r.stdout
    assert r.returncode == 0 and all(ln.startswith("[ok]") for ln in lines), r.stdout
    assert "RANDOM" in r.stdout
    r = run_cli(["doctor", "--checkpoints", str(tmp_path / "none")], {"DITTO_FAST_HOME": str(tmp_path)})
    assert r.returncode == 6 and "[FAIL] checkpoints" in r.stdout


def test_usage_errors_exit_2(tmp_path, run_cli, monkeypatch):
    assert run_cli(["render"]).returncode == 2                              # missing --avatar/--audio
    assert run_cli(["render", "--avatar", "a", "--audio", "x.wav", "--precision", "fp8"]).returncode == 2
    assert run_cli(["nonsense"]).returncode == 2
    # no GPU here: CUDA_VISIBLE_DEVICES only counts before CUDA is first queried in this process
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    r = run_cli(["render", "--avatar", "a", "--audio", "x.wav", "--device", "cuda"],
            {"DITTO_FAST_HOME": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode in (2, 3, 5, 6)   # never a traceback
    assert "Traceback" not in r.stderr


def test_checkpoints_info(tiny_checkpoints, capsys):
    main(["checkpoints", "info", "--checkpoints", str(tiny_checkpoints)])
    out = capsys.readouterr().out
    for name in ("appearance_extractor", "motion_extractor", "warp_network", "decoder", "stitch_network", "lmdm",
                 "hubert"):
        assert name in out
    assert "RANDOM" in out


# ----------------------------------------------------------------------------- hardening (issue 15)
def _checkpoint_copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst / "ditto_pytorch" / "models"


def test_doctor_loads_the_checkpoints_it_checks(tiny_checkpoints, tmp_path, run_cli):
    env = {"DITTO_FAST_HOME": str(tmp_path / "home")}
    models = _checkpoint_copy(tiny_checkpoints, tmp_path / "cut")
    data = (models / "decoder.pth").read_bytes()
    (models / "decoder.pth").write_bytes(data[: len(data) // 2])              # truncated
    wrong = _checkpoint_copy(tiny_checkpoints, tmp_path / "wrong")
    (wrong / "decoder.pth").write_bytes((wrong / "warp_network.pth").read_bytes())   # another network's file
    for root, why in ((tmp_path / "cut", "decoder.pth"), (tmp_path / "wrong", "not the")):
        r = run_cli(["doctor", "--checkpoints", str(root)], env)
        line = next(ln for ln in r.stdout.splitlines() if " checkpoints " in ln)
        assert r.returncode == 6 and line.startswith("[FAIL]") and why in line, r.stdout
    r = run_cli(["doctor", "--checkpoints", str(tiny_checkpoints)], env)
    assert r.returncode == 0 and "loaded" in r.stdout, r.stdout


def test_listing_and_doctor_change_nothing(tiny_checkpoints, tmp_path, run_cli):
    import os

    home = tmp_path / "home"
    r = run_cli(["doctor", "--checkpoints", str(tiny_checkpoints)], {"DITTO_FAST_HOME": str(home)})
    assert r.returncode == 0 and not home.exists(), r.stdout          # no store made by looking at it
    stale = home / "avatars" / ".tmp-ruby-old"
    stale.mkdir(parents=True)
    os.utime(stale, (0, 0))
    before = sorted(p.name for p in (home / "avatars").iterdir())
    for args in (["avatars"], ["avatars", "--json"], ["doctor", "--checkpoints", str(tiny_checkpoints)]):
        assert run_cli(args, {"DITTO_FAST_HOME": str(home)}).returncode == 0
        assert sorted(p.name for p in (home / "avatars").iterdir()) == before, args


def test_seeds_out_of_range_are_usage_errors(tmp_path, run_cli):
    r = run_cli(["render", "--avatar", "a", "--audio", "x.wav", "--seed", str(2**64)], {"DITTO_FAST_HOME": str(tmp_path)})
    assert r.returncode == 2 and "must be in 0..9223372036854775807" in r.stderr, r.stderr      # the setting's message
    r = run_cli(["render", "--avatar", "a", "--audio", "x.wav", "--seed", "-1"], {"DITTO_FAST_HOME": str(tmp_path)})
    assert r.returncode == 2 and "--seed" in r.stderr
    r = run_cli(["checkpoints", "init-random", str(tmp_path / "ck"), "--tiny", "--seed", str(2**64)])
    assert r.returncode == 2 and "--seed" in r.stderr and not (tmp_path / "ck").exists()


def test_render_avatar_must_be_a_name(tmp_path, run_cli, tiny_checkpoints):
    for name in ("../../../etc", "-x", str(tmp_path)):
        r = run_cli(["render", "--avatar", name, "--audio", "x.wav", "--checkpoints", str(tiny_checkpoints)],
                    {"DITTO_FAST_HOME": str(tmp_path)})
        assert r.returncode == 2 and "invalid avatar name" in r.stderr, (name, r.stderr)


def test_output_that_is_an_input_is_refused_and_nothing_is_touched(video_avatar, session_home, tiny_checkpoints,
                                                                   clips, tmp_path, run_cli):
    import shutil

    audio = shutil.copy(clips[0], tmp_path / "a.wav")
    controls = tmp_path / "c.json"
    controls.write_text('{"default": {"yaw": 2}}')
    emotion = tmp_path / "emo.json"
    emotion.write_text('{"default": "happy"}')
    (tmp_path / "via").symlink_to(tmp_path)                               # the same folder by another path
    plate = video_avatar / "plate.mp4"
    watched = [audio, controls, emotion, *sorted(video_avatar.iterdir())]
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in watched}
    listing = sorted(p.name for p in tmp_path.iterdir())
    env = store_env(session_home, tiny_checkpoints)
    base = ["render", "--avatar", "anchor", "--audio", str(audio), "--device", "cpu", "--quiet"]
    for extra, out in (([], audio), (["--controls", str(controls)], controls), (["--emotion", str(emotion)], emotion),
                       ([], plate), ([], video_avatar / "new.mp4"), ([], tmp_path / "via" / "a.wav")):
        r = run_cli([*base, *extra, "-o", str(out)], env)
        assert r.returncode == 2 and "would overwrite an input" in r.stderr, (out, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in watched} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == listing
    assert not (video_avatar / "new.mp4").exists()


@pytest.mark.slow
def test_render_takes_an_inline_emotion_schedule(video_avatar, session_home, tiny_checkpoints, clips, tmp_path,
                                                 run_cli):
    out = tmp_path / "inline.mp4"
    r = run_cli(["render", "--avatar", "anchor", "--audio", str(clips[0]), "-o", str(out), "--device", "cpu",
                 "--quiet", "--emotion", '{"default": "neutral", "frames": {"0-4": "happy"}}'],
                store_env(session_home, tiny_checkpoints))
    assert r.returncode == 0 and out.is_file(), r.stderr


@pytest.mark.slow
def test_the_command_exits_with_mains_code_and_all_its_output(video_avatar, session_home, run_cli):
    """`python -m ditto_fast.cli` (what the `ditto-fast` script runs) skips the interpreter's teardown:
    same exit codes and the same complete stdout as main(), also into a pipe."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "DITTO_FAST_HOME": str(session_home)}
    for args, code in ((["config"], 0), (["avatars", "--json"], 0), (["avatars", "show", "nobody"], 5),
                       (["render", "--bogus"], 2)):
        r = subprocess.run([sys.executable, "-m", "ditto_fast.cli", *args], capture_output=True, text=True, env=env,
                           timeout=120)
        same = run_cli(args, {"DITTO_FAST_HOME": str(session_home)})
        assert r.returncode == same.returncode == code, (args, r.stderr)
        assert r.stdout == same.stdout and r.stderr.strip() == same.stderr.strip()
    assert len(r.stdout) == 0 and "no such option" in r.stderr.lower()
    # no stdout at all (>&-): the command still succeeds
    r = subprocess.run([sys.executable, "-m", "ditto_fast.cli", "config"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, env=env, timeout=120, close_fds=True,
                       preexec_fn=lambda: os.close(1))
    assert r.returncode == 0, r.stderr



def _cut_short(tmp_path, speech_wav, ext: str):
    """The test speech (10 s) as `ext`, with only its first 3 % of bytes: a copy cut short (about 0.3 s left)."""
    import soundfile as sf

    audio, rate = sf.read(speech_wav, dtype="float32")
    full = tmp_path / f"full.{ext}"
    sf.write(full, audio, rate)
    cut = tmp_path / f"news.{ext}"
    cut.write_bytes(full.read_bytes()[:full.stat().st_size * 3 // 100])
    return len(audio) / rate, cut


@pytest.mark.parametrize("ext", ["wav", "flac"])
def test_audio_cut_short_is_refused_by_render_and_batch(video_avatar, session_home, tiny_checkpoints, speech_wav,
                                                        tmp_path, run_cli, ext):
    import re

    seconds, cut = _cut_short(tmp_path, speech_wav, ext)
    env = store_env(session_home, tiny_checkpoints)
    out = tmp_path / "out" / "news.mp4"
    out.parent.mkdir()
    r = run_cli(["render", "--avatar", "anchor", "--audio", cut, "-o", out, "--device", "cpu", "--quiet"], env)
    assert r.returncode == 3, r.stderr
    line, = r.stderr.strip().splitlines()
    held = re.fullmatch(rf"ditto-fast: error: {re.escape(str(cut))}: declares {seconds:.2f} s of audio but holds "
                        r"(\d\.\d\d) s \(cut short in transfer\?\); re-export or copy it again", line)
    assert held and float(held[1]) < 0.5, line
    report = tmp_path / "report.json"
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"avatar": "anchor", "audio": str(cut), "output": str(out)}) + "\n")
    r = run_cli(["batch", jobs, "--device", "cpu", "--quiet", "--report", report], env)
    row, = json.loads(report.read_text())["jobs"]
    assert r.returncode == 7 and row["exit_code"] == 3, r.stderr
    assert row["error"] == f"{jobs}:1: " + line.split("error: ", 1)[1]
    assert list(out.parent.iterdir()) == []


@pytest.mark.slow
def test_complete_flac_still_renders(video_avatar, session_home, tiny_checkpoints, speech_wav, tmp_path, run_cli):
    import soundfile as sf

    audio, rate = sf.read(speech_wav, dtype="float32", frames=8000)       # 0.5 s
    flac = tmp_path / "short.flac"
    sf.write(flac, audio, rate)
    out = tmp_path / "short.mp4"
    r = run_cli(["render", "--avatar", "anchor", "--audio", flac, "-o", out, "--device", "cpu", "--quiet"],
                store_env(session_home, tiny_checkpoints))
    assert r.returncode == 0 and out.is_file(), r.stderr


def test_output_names_that_are_only_an_extension_or_hidden_are_refused(video_avatar, session_home, tiny_checkpoints,
                                                                       clips, tmp_path, run_cli, monkeypatch):
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    env = store_env(session_home, tiny_checkpoints)
    for out in ("out/..mp4", "out/.mp4", ".hidden.mp4"):
        r = run_cli(["render", "--avatar", "anchor", "--audio", clips[0], "-o", out, "--device", "cpu", "--quiet"],
                    env)
        line, = r.stderr.strip().splitlines()
        assert r.returncode == 2 and line.startswith(f"ditto-fast: error: {out}: the output name starts with a dot"), \
            r.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["out"]


def test_an_out_dir_in_the_way_of_a_file_is_refused(video_avatar, session_home, tiny_checkpoints, clips, tmp_path,
                                                    run_cli):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.wav").write_bytes(clips[0].read_bytes())
    (tmp_path / "taken").write_text("x")
    r = run_cli(["batch", "--avatar", "anchor", "--audio-dir", tmp_path / "in", "--out-dir", tmp_path / "taken",
                 "--device", "cpu", "--quiet"], store_env(session_home, tiny_checkpoints))
    assert r.returncode == 3 and r.stderr.strip() == (f"ditto-fast: error: {tmp_path / 'taken'}: cannot create the "
                                                      "--out-dir folder (a file of that name is in the way); choose "
                                                      "another folder"), r.stderr


def test_an_output_another_process_writes_is_refused_naming_it(video_avatar, session_home, tiny_checkpoints, clips,
                                                               tmp_path, run_cli):
    """Another process holds the output's claim: render exits 3 at check time, a batch fails that job alone."""
    from support import busy_message, hold

    out = tmp_path / "news.mp4"
    other = hold(out)
    try:
        env = store_env(session_home, tiny_checkpoints)
        r = run_cli(["render", "--avatar", "anchor", "--audio", clips[0], "-o", out, "--device", "cpu", "--quiet"],
                    env)
        assert r.returncode == 3 and r.stderr.strip() == f"ditto-fast: error: {busy_message(out, other.pid)}"
        jobs = tmp_path / "jobs.jsonl"
        jobs.write_text(json.dumps({"avatar": "anchor", "audio": str(clips[0]), "output": str(out)}) + "\n")
        r = run_cli(["batch", jobs, "--device", "cpu", "--quiet", "--report", tmp_path / "r.json"], env)
        row, = json.loads((tmp_path / "r.json").read_text())["jobs"]
        assert r.returncode == 7 and row["exit_code"] == 3
        assert row["error"] == f"{jobs}:1: {busy_message(out, other.pid)}"
        assert sorted(p.name for p in tmp_path.iterdir()) == [".news.mp4.claim", "jobs.jsonl", "r.json"]
    finally:
        other.stdin.close()
        other.wait(timeout=60)
