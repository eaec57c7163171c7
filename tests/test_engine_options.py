"""The engine's options, declared once in EngineOptions: the render, batch and serve options are made from its
fields (choices and ranges from the config's declarations), the same --checkpoints and --device everywhere, and
the object goes whole to the engine and, pickled, to a Ray actor."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import click
import pytest

from ditto_fast.core.config import DEVICES, ENCODERS, PRECISIONS, declaration, load_config
from ditto_fast.core.errors import UsageError
from ditto_fast.engine.options import ENGINE_FIELDS, EngineOptions


def _options(command: click.Command) -> dict[str, click.Option]:
    return {p.name: p for p in command.params if isinstance(p, click.Option)}


def test_the_engine_commands_take_every_engine_option_as_declared():
    from ditto_fast.cli import batch, render, serve

    flagged = [f for f in ENGINE_FIELDS if f.metadata["flags"]]
    assert {f.name for f in ENGINE_FIELDS} - {f.name for f in flagged} == {"config"}     # --config: a file
    for command in (render, batch, serve):
        opts = _options(command)
        for f in flagged:
            assert opts[f.name].opts == list(f.metadata["flags"]), (command.name, f.name)
    opts = _options(render)
    from ditto_fast.engine.precision import DTYPES

    assert set(DTYPES) == set(PRECISIONS) - {"auto"}         # what --precision names, the engine knows
    assert [tuple(opts[k].type.choices) for k in ("device", "precision", "encoder")] == [DEVICES, PRECISIONS, ENCODERS]
    for key in ("batch_size", "crf", "preset", "output_stage", "launch", "encoder_threads"):   # render.<key>'s declaration
        assert (opts[key].type.section, opts[key].type.key) == ("render", key)
    assert opts["batch_size"].type.decl == declaration("render", "batch_size")


def test_checkpoints_and_device_are_one_option_everywhere():
    from ditto_fast.commands.checkpoints import checkpoints_info
    from ditto_fast.commands.doctor import doctor
    from ditto_fast.commands.register import register
    from ditto_fast.commands.render import render

    ref = _options(render)
    for command in (register, checkpoints_info, doctor):
        opt = _options(command)["checkpoints"]
        assert (opt.opts, opt.help) == (ref["checkpoints"].opts, ref["checkpoints"].help), command.name
    assert _options(register)["device"].type.choices == ref["device"].type.choices


@pytest.mark.parametrize("args, said", [(["--crf", "52"], "must be in 0..51, got 52"),
                                        (["--batch-size", "0"], "must be in 1..64 or auto, got 0"),
                                        (["--precision", "fp8"], "'fp8' is not one of 'auto', 'fp16', 'bf16', 'fp32'")])
def test_a_bad_engine_option_is_refused_before_anything_loads(args, said, run_cli, tmp_path):
    for command in (["render", "--avatar", "a", "--audio", "x.wav"], ["batch", str(tmp_path / "jobs.jsonl")]):
        r = run_cli([*command, *args], {"DITTO_FAST_HOME": str(tmp_path)})
        assert r.returncode == 2 and said in r.stderr, r.stderr


def test_the_options_pickle_whole():
    """What a Ray actor gets: the options as given, the settings with them."""
    options = EngineOptions(device="cpu", precision="fp32", batch_size=2, crf=20, checkpoints="/ckpt",
                            config=load_config())
    assert pickle.loads(pickle.dumps(options)) == options
    assert EngineOptions().settings() == load_config()


@pytest.mark.parametrize("given, said", [
    ({"device": "gpu"}, "device must be one of auto, cpu, cuda (or cuda:N), got 'gpu'"),
    ({"device": "cuda:x"}, "device must be one of auto, cpu, cuda (or cuda:N), got 'cuda:x'"),
    ({"precision": "fp8"}, "precision must be one of auto, fp16, bf16, fp32, got 'fp8'"),
    ({"batch_size": 0}, "batch_size must be in 1..64 or auto, got 0"),
    ({"batch_size": True}, "batch_size must be an integer in 1..64 or auto, got True"),
    ({"batch_size": "8"}, "batch_size must be an integer in 1..64 or auto, got '8'"),
    ({"crf": 52}, "crf must be in 0..51, got 52"),
    ({"crf": 2.5}, "crf must be an integer in 0..51, got 2.5"),
    ({"preset": "warp"}, "preset must be one of ultrafast, superfast, veryfast, faster, fast, medium, slow, got"),
    ({"encoder": "x264"}, "encoder must be one of auto, software, nvenc, got 'x264'"),
    ({"output_stage": "async"}, "output_stage must be one of inline, thread, got 'async'"),
    ({"launch": "cuda"}, "launch must be one of eager, graphs, compile, got 'cuda'"),
    ({"encoder_threads": 0}, "encoder_threads must be in 1..128 or auto, got 0"),
    ({"checkpoints": 3}, "checkpoints must be a checkpoint directory, got 3"),
    ({"config": {"render": {}}}, "config must be the settings (a Config, from load_config)"),
])
def test_options_made_in_python_are_refused_when_made(given, said):
    """`EngineOptions(device="gpu")` used to surface as torch's RuntimeError when the engine started: a bad option is
    a UsageError naming it and what it allows, when the object is made (and again when it is replaced)."""
    with pytest.raises(UsageError) as e:
        EngineOptions(**given)
    assert str(e.value).startswith(said), e.value
    with pytest.raises(UsageError):
        dataclasses.replace(EngineOptions(), **given)


def test_good_options_made_in_python_are_kept_as_given():
    options = EngineOptions(device="cuda:1", precision="bf16", batch_size="auto", crf=0, preset="Fast",
                            encoder="software", checkpoints=Path("/ckpt"))
    assert (options.device, options.batch_size, options.crf, options.preset, options.checkpoints) == \
        ("cuda:1", "auto", 0, "fast", Path("/ckpt"))
    assert EngineOptions(batch_size=8.0).batch_size == 8 and EngineOptions(checkpoints="ck").checkpoints == "ck"
    assert pickle.loads(pickle.dumps(options)) == options


def test_the_frame_loops_options_settle_into_the_setup_and_the_digest(tiny_checkpoints, monkeypatch):
    """output_stage, launch and encoder_threads come from the options, else the settings (inline, eager, auto: today's
    render). The digest names what changes the bytes, and only then (outputs made before keep their digests): a
    thread count given, and launch compile (compiled kernels); CUDA graphs replay the eager kernels and the output
    stage moves work to a thread, so neither is in it."""
    import ditto_fast.engine.render_setup as render_setup
    from ditto_fast.engine.render_setup import RenderSetup

    base = RenderSetup.resolve(EngineOptions(checkpoints=tiny_checkpoints, device="cpu"))
    assert (base.output_stage, base.launch, base.encoder_threads) == ("inline", "eager", None)
    other = RenderSetup.resolve(EngineOptions(checkpoints=tiny_checkpoints, device="cpu", output_stage="thread",
                                              launch="compile", encoder_threads=6))
    assert (other.output_stage, other.launch, other.encoder_threads) == ("thread", "compile", 6)
    cfg = load_config()
    cfg = dataclasses.replace(cfg, render=dataclasses.replace(cfg.render, output_stage="thread", launch="graphs",
                                                              encoder_threads=3))
    from_settings = RenderSetup.resolve(EngineOptions(checkpoints=tiny_checkpoints, device="cpu", config=cfg))
    assert (from_settings.output_stage, from_settings.launch, from_settings.encoder_threads) == ("thread", "graphs", 3)
    assert pickle.loads(pickle.dumps(other)).launch == "compile"        # what an engine process is sent

    monkeypatch.setattr(render_setup, "clip_digest", lambda clip, settings: settings)   # what the digest is made of
    monkeypatch.setattr(RenderSetup, "output_format", lambda self, clip: type("F", (), {"encoder": "libx264"})())
    clip = type("Clip", (), {"emotion_auto": None})()
    plain = base.digest(clip)
    assert "launch" not in plain and "encoder_threads" not in plain
    assert dataclasses.replace(base, output_stage="thread", launch="graphs").digest(clip) == plain
    assert other.digest(clip) == {**plain, "launch": "compile", "encoder_threads": 6}
