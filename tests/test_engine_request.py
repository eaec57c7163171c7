"""The render request: one declaration of every per-clip setting, refused alike from the CLI, a job line and
Python; one render decodes its audio once and opens its avatar once."""

from __future__ import annotations

import json

import pytest

from ditto_fast.batch.jobs import read_jobs
from ditto_fast.core.errors import UsageError
from ditto_fast.engine.request import FIELDS, JOB_KEYS, RenderRequest

BAD = [("seed", -1, "must be in 0..9223372036854775807, got -1"),
       ("seed", 2**64, "must be in 0..9223372036854775807"),
       ("steps", 0, "must be in 1..1000, got 0"),
       ("steps", 1001, "must be in 1..1000, got 1001"),
       ("codec", "vp9", "must be one of h264, hevc, prores, got 'vp9'"),
       ("fps", "31", "frame rate '31' is not one of"),
       ("avatar", "../x", "invalid avatar name '../x'")]


@pytest.mark.parametrize("key, value, said", BAD)
def test_python_a_job_line_and_the_cli_refuse_the_same_value_with_the_same_message(key, value, said, tmp_path,
                                                                                 run_cli):
    base = {"avatar": "ruby", "audio": "a.wav", "output": "a.mp4"}
    with pytest.raises(UsageError) as python:
        RenderRequest(**{**base, key: value})
    assert said in str(python.value)
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({**base, key: value}) + "\n")
    job = read_jobs(jobs)[0]
    assert job.status == "failed" and job.exit_code == 2 and said in job.error
    assert job.error == f"{jobs}:1: {python.value}"                  # the same words, after the line's place
    flag = next(f.metadata["flags"][-1] for f in FIELDS if f.name == key)
    args = {"--avatar": "ruby", "--audio": "a.wav", flag: str(value)}
    r = run_cli(["render", *[x for kv in args.items() for x in kv]], {"DITTO_FAST_HOME": str(tmp_path)})
    assert r.returncode == 2 and said in r.stderr, r.stderr


def test_the_options_and_job_keys_are_the_request_fields():
    from ditto_fast.cli import batch, render

    render_opts = {p.name for p in render.params}
    batch_opts = {p.name for p in batch.params}
    assert set(JOB_KEYS) == {f.name for f in FIELDS} <= render_opts
    assert {f.name for f in FIELDS} - {"audio", "output"} <= batch_opts      # defaults for the jobs
    # each field's default and range come from the config's declarations
    cfg_backed = {f.name: f.metadata["setting"] for f in FIELDS if f.metadata["setting"]}
    assert cfg_backed == {"steps": ("motion", "steps"), "seed": ("clip", "seed"), "emotion": ("clip", "emotion"),
                          "codec": ("clip", "codec"), "blend": ("render", "blend"),
                          "emotion_strength": ("clip", "emotion_strength")}


def test_the_config_gives_what_a_request_leaves_out(tmp_path):
    from ditto_fast.core.config import load_config

    (tmp_path / "c.yaml").write_text("clip:\n  seed: 9\n  codec: hevc\nmotion:\n  steps: 7\n")
    filled = RenderRequest("ruby", "a.wav", seed=2).with_defaults(load_config(tmp_path / "c.yaml"))
    assert filled == {"steps": 7, "seed": 2, "emotion": "neutral", "codec": "hevc", "blend": "seamless",
                      "emotion_strength": 1.0}
    (tmp_path / "bad.yaml").write_text("clip:\n  seed: -3\n")
    with pytest.raises(UsageError, match=r"bad.yaml: clip.seed must be in 0..9223372036854775807, got -3"):
        load_config(tmp_path / "bad.yaml")


@pytest.mark.slow
def test_one_render_decodes_its_audio_once_and_opens_its_avatar_once(video_avatar, session_home, tiny_checkpoints,
                                                                    clips, tmp_path, run_cli, monkeypatch):
    import ditto_fast.audio.decode as decode
    import ditto_fast.avatar as avatar_pkg
    import ditto_fast.engine.open_avatars as open_avatars
    import ditto_fast.engine.single as single

    counts = {"decode": 0, "sha": 0, "avatar": 0}

    def counted(key, fn):
        def wrapper(*a, **k):
            counts[key] += 1
            return fn(*a, **k)
        return wrapper

    monkeypatch.setattr(decode, "_decode", counted("decode", decode._decode))     # every decoding goes through it
    monkeypatch.setattr(decode, "file_sha256", counted("sha", decode.file_sha256))
    monkeypatch.setattr(avatar_pkg, "load_avatar", counted("avatar", avatar_pkg.load_avatar))
    for module in (open_avatars, single):         # every opening: the engines' and checks' (OpenAvatars), render's
        monkeypatch.setattr(module, "load_avatar", counted("avatar", module.load_avatar))
    env = {"DITTO_FAST_CHECKPOINTS": str(tiny_checkpoints)}
    r = run_cli(["render", "--avatar", "anchor", "--audio", clips[0], "-o", tmp_path / "a.mp4", "--quiet"], env)
    assert r.returncode == 0, r.stderr
    assert counts == {"decode": 1, "sha": 1, "avatar": 1}
    # a batch: each job's audio once, each avatar once for all its jobs
    counts.update(decode=0, sha=0, avatar=0)
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"avatar": "anchor", "audio": str(c), "output": f"{i}.mp4"}) + "\n"
                            for i, c in enumerate(clips[:2])))
    r = run_cli(["batch", jobs, "--quiet"], env)
    assert r.returncode == 0, r.stderr
    assert counts == {"decode": 2, "sha": 2, "avatar": 1}


@pytest.mark.parametrize("key", ["seed", "steps", "fps", "loudness", "codec", "blend", "emotion", "timecode",
                                 "delivery", "audio", "controls"])
def test_a_boolean_is_no_number_nor_a_word(key):
    """True is an int in Python (and `true` in a job line's JSON): no field takes it for 1."""
    with pytest.raises(UsageError, match=f"^{key} must be"):
        RenderRequest(**{"avatar": "ruby", "audio": "a.wav", key: True})


def test_a_huge_number_is_refused_by_its_range():
    with pytest.raises(UsageError, match=r"^seed must be in 0\.\.9223372036854775807, got 1000000"):
        RenderRequest("ruby", "a.wav", seed=10**400)            # was an OverflowError: float(10**400)
