"""`--emotion auto` in renders (tiny random checkpoints): the track reaches the LMDM as a label would, its strength
blends toward neutral, the timings JSON, batch report and preview carry it, serve and batch jobs take it, and
without the classifier's folder it is exit 6 before any work."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from ditto_fast.checkpoints import EMOTION_DIRNAME
from ditto_fast.cli import main
from ditto_fast.core.errors import CheckpointError
from ditto_fast.engine.request import RenderRequest
from ditto_fast.motion.emotions import EMOTIONS


@pytest.fixture(scope="module")
def auto_render(engine, clips, tmp_path_factory):
    out = tmp_path_factory.mktemp("auto")
    return engine.render(RenderRequest("anchor", clips[1], out / "auto.mp4", emotion="auto"))


@pytest.mark.slow
def test_auto_reaches_the_lmdm_as_the_label_it_holds(engine, clips, auto_render, tmp_path):
    record = auto_render.timings["emotion"]
    frames = auto_render.timings["frames"]
    assert record["source"] == "auto" and record["windows"] == 1 and record["switches"] == 0    # 0.6 s: one window
    assert auto_render.emotion.shape == (frames, 8)
    held = record["per_second"][0]["label"]
    same = engine.render(RenderRequest("anchor", clips[1], tmp_path / "label.mp4", emotion=held))
    np.testing.assert_array_equal(auto_render.mouth, same.mouth)     # the same condition, the same motion
    other = next(e for e in ("happy", "sad") if e != held)
    differs = engine.render(RenderRequest("anchor", clips[1], tmp_path / "other.mp4", emotion=other))
    assert not np.array_equal(auto_render.mouth, differs.mouth)      # (the emotion does move the mouth)
    assert same.timings["digest"] != auto_render.timings["digest"]
    neutral = engine.render(RenderRequest("anchor", clips[1], tmp_path / "n.mp4", emotion="neutral"))
    quiet = engine.render(RenderRequest("anchor", clips[1], tmp_path / "q.mp4", emotion="auto",
                                        emotion_strength=0.0))
    np.testing.assert_allclose(quiet.mouth, neutral.mouth, atol=1e-5)        # strength 0: neutral
    assert quiet.timings["digest"] != auto_render.timings["digest"]


@pytest.mark.slow
def test_timings_carry_the_track_per_second(auto_render):
    record = auto_render.timings["emotion"]
    assert len(record["per_second"]) == 1 and record["seconds"] > 0
    row = record["per_second"][0]
    assert row["second"] == 0 and row["label"] in EMOTIONS and set(row["probabilities"]) == set(EMOTIONS)
    assert abs(sum(row["probabilities"].values()) - 1) < 0.01 and row["probabilities"]["contempt"] == 0
    assert record["settings"]["window"] == 4.0 and record["model"].endswith(EMOTION_DIRNAME)
    assert record["random_weights"] is True                          # init-random's classifier: its readings are noise
    json.dumps(auto_render.timings)                 # all of it goes into the --timings file
    from ditto_fast.engine.renderer import stage_table

    assert f"emotion auto: {row['label']} 0 s (0 switches" in stage_table(auto_render.timings)


@pytest.mark.slow
def test_the_preview_plots_the_track_under_the_waveform(auto_render, clips, tmp_path):
    from ditto_fast.preview.render_strip import EMOTION_COLOURS, write_render_preview

    args = (auto_render.output, clips[1], auto_render.timings["frames"], auto_render.timings["rate"])
    plain = cv2.imread(str(write_render_preview(tmp_path / "plain.png", *args, mouth=auto_render.mouth)))
    banded = cv2.imread(str(write_render_preview(tmp_path / "band.png", *args, mouth=auto_render.mouth,
                                                 emotion=auto_render.emotion)))
    assert banded.shape[0] > plain.shape[0]
    top = int(np.argmax(auto_render.emotion[0]))
    colour = np.array(EMOTION_COLOURS[top], np.uint8)
    assert (banded == colour).all(axis=2).sum() > (plain == colour).all(axis=2).sum() + 1000


def _ckpt_without_classifier(tiny_checkpoints: Path, tmp_path: Path) -> Path:
    root = tmp_path / "ck"
    shutil.copytree(tiny_checkpoints, root, ignore=shutil.ignore_patterns(EMOTION_DIRNAME))
    return root


def test_without_the_classifier_auto_is_exit_6_before_any_work(run_cli, clips, tmp_path, tiny_checkpoints,
                                                               session_home, video_avatar):
    root = _ckpt_without_classifier(tiny_checkpoints, tmp_path)
    env = {"DITTO_FAST_HOME": str(session_home), "DITTO_FAST_CHECKPOINTS": str(root)}
    out, timings = tmp_path / "a.mp4", tmp_path / "t.json"
    t0 = time.perf_counter()
    r = run_cli(["render", "--avatar", "anchor", "--audio", str(clips[0]), "-o", str(out), "--emotion",
                 "auto+happy", "--timings", str(timings), "--device", "cpu", "--quiet"], env)
    assert r.returncode == 6, r.stderr
    assert str(root / EMOTION_DIRNAME) in r.stderr and "speech-emotion" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not out.exists() and not timings.exists() and time.perf_counter() - t0 < 20
    schedule = json.dumps({"default": "neutral", "frames": {"2-": "auto"}})
    r = run_cli(["render", "--avatar", "anchor", "--audio", str(clips[0]), "-o", str(out), "--emotion", schedule,
                 "--device", "cpu", "--quiet"], env)
    assert r.returncode == 6 and not out.exists()


@pytest.mark.slow
def test_batch_takes_auto_reports_the_track_and_fails_only_that_job_without_the_classifier(
        engine, clips, tmp_path, tiny_checkpoints, session_home, capsys, monkeypatch):
    monkeypatch.setenv("DITTO_FAST_HOME", str(session_home))
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"avatar": "anchor", "audio": str(clips[0]), "output": "auto.mp4",
                                "emotion": "auto"}) + "\n")
    report = tmp_path / "report.json"
    with pytest.raises(SystemExit) as e:
        main(["batch", str(jobs), "--report", str(report), "--checkpoints", str(tiny_checkpoints), "--device", "cpu",
              "--quiet"])
        raise SystemExit(0)
    assert e.value.code == 0, capsys.readouterr().err
    row = json.loads(report.read_text())["jobs"][0]
    assert row["status"] == "done" and row["emotion"]["per_second"][0]["label"] in EMOTIONS, row
    root = _ckpt_without_classifier(tiny_checkpoints, tmp_path)
    (tmp_path / "auto.mp4").unlink()
    with pytest.raises(SystemExit) as e:
        main(["batch", str(jobs), "--report", str(report), "--checkpoints", str(root), "--device", "cpu", "--quiet"])
        raise SystemExit(0)
    assert e.value.code == 7
    row = json.loads(report.read_text())["jobs"][0]
    assert row["status"] == "failed" and row["exit_code"] == 6 and EMOTION_DIRNAME in row["error"], row


def test_serve_accepts_auto_and_refuses_it_without_the_classifier(serve_parts, clips, tmp_path, monkeypatch):
    audio = Path(shutil.copy(clips[0], tmp_path / "a.wav"))
    parts = serve_parts
    parts.acceptor.check({"avatar": "anchor", "audio": str(audio), "output": str(tmp_path / "a.mp4"),
                          "emotion": "auto"}, "request")
    cs = parts.acceptor.setup.checkpoints
    monkeypatch.setattr(type(cs), "emotion_dir", property(lambda self: tmp_path / "none"))
    with pytest.raises(CheckpointError, match="speech-emotion model directory missing"):
        parts.acceptor.check({"avatar": "anchor", "audio": str(audio), "output": str(tmp_path / "b.mp4"),
                              "emotion": "auto"}, "request")


@pytest.mark.slow
def test_render_writes_the_track_into_its_timings_and_preview(run_cli, clips, tmp_path, tiny_checkpoints,
                                                              session_home, video_avatar):
    env = {"DITTO_FAST_HOME": str(session_home), "DITTO_FAST_CHECKPOINTS": str(tiny_checkpoints)}
    out, timings, preview = tmp_path / "a.mp4", tmp_path / "t.json", tmp_path / "p.png"
    r = run_cli(["render", "--avatar", "anchor", "--audio", str(clips[2]), "-o", str(out), "--emotion", "auto+sad",
                 "--emotion-strength", "0.8", "--timings", str(timings), "--preview", str(preview), "--device",
                 "cpu"], env)
    assert r.returncode == 0, r.stderr
    record = json.loads(timings.read_text())["emotion"]
    assert record["per_second"][0]["label"] in EMOTIONS and "emotion auto:" in r.stderr
    plain = tmp_path / "plain.png"
    r = run_cli(["render", "--avatar", "anchor", "--audio", str(clips[2]), "-o", str(tmp_path / "b.mp4"),
                 "--preview", str(plain), "--device", "cpu", "--quiet"], env)
    assert r.returncode == 0 and cv2.imread(str(preview)).shape[0] > cv2.imread(str(plain)).shape[0]
