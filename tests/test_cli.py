"""The small commands: avatars (list/show/rm, --json), doctor, usage errors and exit codes.

All run in this process through `cli.main` (the `run_cli` fixture): same exit codes and stderr lines
as a real process, without its start-up time.
"""

from __future__ import annotations

import json

import torch

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
    assert r.returncode == 1 and "[FAIL] checkpoints" in r.stdout


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
