"""Batch job files: parsing, relative paths, bad lines reported per job, the audio-folder form, the report."""

from __future__ import annotations

import json
import os

import pytest

from ditto_fast.engine.request import RenderRequest
from ditto_fast.batch.jobs import Job, jobs_from_dir, read_jobs, summary, write_report
from ditto_fast.core.errors import InputError, UsageError


def test_jobs_file_paths_are_relative_to_it_and_bad_lines_fail_alone(tmp_path):
    d = tmp_path / "night"
    d.mkdir()
    f = d / "jobs.jsonl"
    f.write_text("\n".join([
        '{"avatar": "ruby", "audio": "a.wav", "output": "out/a.mp4", "seed": 3, "steps": 10}',
        "",
        "# a comment",
        '{"avatar": "ruby", "audio": "b.wav", "output": "b.mp4", "emotion": "happy+surprise", "controls": "c.json"}',
        '{"avatar": "ruby", "audio": "c.wav"',
        '{"avatar": "ruby", "audio": "c.wav", "output": "c.mp4", "colour": "blue"}',
        '{"avatar": "ruby", "audio": "c.wav", "output": "c.mp4", "seed": 18446744073709551616}',
        '{"avatar": "ruby", "audio": "c.wav", "output": "c.mp4", "steps": "25"}',
        '["not", "an", "object"]',
        '{"audio": "c.wav", "output": "c.mp4"}',
    ]) + "\n")
    jobs = read_jobs(f)
    assert [j.index for j in jobs] == list(range(8))
    a, b = jobs[0], jobs[1]
    assert a.status == b.status == "queued"
    assert a.audio == d / "a.wav" and a.output == d / "out" / "a.mp4"
    assert a.request.seed == 3 and a.request.steps == 10
    assert b.request.emotion == "happy+surprise" and b.request.controls == d / "c.json"
    assert b.request.seed is None and b.request.steps is None          # the config's, when the job is checked
    errors = [j.error for j in jobs[2:]]
    assert all(j.status == "failed" and j.exit_code == 2 for j in jobs[2:])
    assert "jobs.jsonl:5" in errors[0] and "not valid JSON" in errors[0]
    assert "unknown key 'colour'" in errors[1] and "seed must be" in errors[2] and "steps must be" in errors[3]
    assert "expected a JSON object" in errors[4] and "'avatar' is missing" in errors[5]


def test_jobs_file_errors(tmp_path):
    with pytest.raises(InputError, match="not found"):                # a named input missing: exit 3
        read_jobs(tmp_path / "none.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n# nothing\n")
    with pytest.raises(UsageError, match="no jobs"):
        read_jobs(tmp_path / "empty.jsonl")


def test_audio_dir_gives_one_job_per_audio_file(tmp_path):
    (tmp_path / "in").mkdir()
    for name in ("b.mp3", "a.wav", "notes.txt", "c.FLAC"):
        (tmp_path / "in" / name).write_bytes(b"x")
    jobs = jobs_from_dir("ruby", tmp_path / "in", tmp_path / "out")
    assert [j.audio.name for j in jobs] == ["a.wav", "b.mp3", "c.FLAC"]
    assert [j.output for j in jobs] == [tmp_path / "out" / f"{s}.mp4" for s in "abc"]
    assert all(j.avatar == "ruby" for j in jobs)
    (tmp_path / "silent").mkdir()
    with pytest.raises(UsageError, match="no audio files"):
        jobs_from_dir("ruby", tmp_path / "silent", tmp_path)
    with pytest.raises(InputError, match="not a directory"):
        jobs_from_dir("ruby", tmp_path / "missing", tmp_path)


def test_audio_dir_creates_a_missing_out_dir_like_mkdir_p(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.wav").write_bytes(b"x")
    out = tmp_path / "night" / "2024" / "mp4"
    old = os.umask(0o027)
    try:
        jobs = jobs_from_dir("ruby", tmp_path / "in", out)
    finally:
        os.umask(old)
    assert out.is_dir() and [j.output for j in jobs] == [out / "a.mp4"]
    assert [oct(p.stat().st_mode & 0o777) for p in (tmp_path / "night", tmp_path / "night" / "2024", out)] == \
        [oct(0o750)] * 3                                   # the process's umask, as mkdir -p
    assert list(out.iterdir()) == []
    jobs_from_dir("ruby", tmp_path / "in", out)           # there already: fine
    (tmp_path / "afile").write_text("x")
    for bad, why in ((tmp_path / "afile", "a file of that name is in the way"),
                     (tmp_path / "afile" / "mp4", "Not a directory")):
        with pytest.raises(InputError) as e:
            jobs_from_dir("ruby", tmp_path / "in", bad)
        assert str(e.value) == f"{bad}: cannot create the --out-dir folder ({why}); choose another folder"

def test_report_is_written_whole_with_a_summary(tmp_path):
    jobs = [Job(0, RenderRequest("ruby", tmp_path / "a.wav", tmp_path / "a.mp4"), status="done", frames=50, seconds=1.234),
            Job(1, RenderRequest("ruby", tmp_path / "b.wav", tmp_path / "b.mp4"), status="skipped"),
            Job(2, named={"avatar": "ruby"})]
    jobs[2].fail(UsageError("x.wav: bad\nsecond line"))
    old = os.umask(0o022)
    try:
        write_report(tmp_path / "report.json", jobs)
    finally:
        os.umask(old)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["summary"] == summary(jobs) == {"done": 1, "skipped": 1, "failed": 1}
    row = data["jobs"][2]
    assert row["status"] == "failed" and row["error"] == "x.wav: bad\\nsecond line" and row["exit_code"] == 2
    assert set(data["jobs"][0]) >= {"index", "avatar", "audio", "output", "status", "error", "exit_code",
                                     "frames", "seconds"}
    assert (tmp_path / "report.json").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_outputs_that_are_inputs_fail_alone(video_avatar, tiny_checkpoints, clips, tmp_path):
    """An output that is an input of any job (audio, controls, emotion schedule, a file of an avatar) fails
    with exit 2 before anything renders; so does an avatar named by a path; the other jobs stand."""
    import shutil

    from ditto_fast.batch.jobs import check_jobs
    from ditto_fast.engine.options import EngineOptions
    from ditto_fast.engine.render_setup import RenderSetup

    import subprocess

    import imageio_ffmpeg

    subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", str(clips[0]), str(tmp_path / "a0.mkv")],
                   check=True)                                           # audio in a name an output may have
    shutil.copy(clips[1], tmp_path / "a1.wav")
    (tmp_path / "c.mov").write_text('{"default": {"yaw": 2}}')          # any name holds JSON
    (tmp_path / "emo.mkv").write_text('{"default": "happy"}')
    rows = [{"audio": "a0.mkv", "output": "ok.mp4", "emotion": {"default": "sad", "frames": {"0-3": "happy"}},
             "controls": "c.mov"},
            {"audio": "a0.mkv", "output": "a0.mkv"},                           # its own audio
            {"audio": "a1.wav", "output": "c.mov"},                            # another job's controls
            {"audio": "a1.wav", "output": "emo.mkv", "controls": "c.mov"},     # another job's emotion schedule
            {"audio": "a1.wav", "output": str(video_avatar / "plate.mp4")},
            {"audio": "a1.wav", "output": "x.mp4", "emotion": str(tmp_path / "emo.mkv"), "avatar": "../avatars/anchor"}]
    f = tmp_path / "jobs.jsonl"
    f.write_text("".join(json.dumps({"avatar": "anchor", **r}) + "\n" for r in rows))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    jobs = read_jobs(f)
    check_jobs(jobs, RenderSetup.resolve(EngineOptions(device="cpu", checkpoints=tiny_checkpoints)))
    assert jobs[0].status == "queued", jobs[0].error
    assert [j.exit_code for j in jobs[1:]] == [2] * 5, [j.error for j in jobs]
    said = ("would overwrite an input", "is an input of this batch")
    assert all(any(s in j.error for s in said) for j in jobs[1:5]), [j.error for j in jobs]
    assert "invalid avatar name" in jobs[5].error
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
