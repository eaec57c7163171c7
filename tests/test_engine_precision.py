"""`--precision auto`: fp16 on CUDA; on a CPU a rule of its ISA flags (bf16 with AMX-BF16 or AVX512-BF16, else
fp32), never a timing: two fresh stores choose alike, write nothing for it and render the same bytes."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch

from ditto_fast.engine import precision as prec
from ditto_fast.engine.request import RenderRequest


@pytest.fixture()
def unpinned(monkeypatch):
    monkeypatch.delenv(prec.PIN_ENV, raising=False)        # the suite pins fp32 (conftest); these tests choose


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n\n"
                    "processor\t: 1\nflags\t\t: fpu avx2\n")
    assert prec.cpu_flags(info) == {"fpu", "avx2", "avx512f", "amx_bf16", "amx_tile"}       # the first CPU's
    assert prec.cpu_flags(tmp_path / "missing") == frozenset()
    kind = prec.cpu_kind()
    assert kind["model"] and set(kind["flags"]) <= set(prec.KIND_FLAGS)


@pytest.mark.parametrize("flags, want", [
    ({"fpu", "avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}, ("bf16", "bf16: cpu flags: amx_bf16, avx512_bf16")),
    ({"avx2", "avx512f", "avx512_bf16"}, ("bf16", "bf16: cpu flags: avx512_bf16")),       # Zen 4, Cooper Lake
    ({"avx2", "amx_bf16"}, ("bf16", "bf16: cpu flags: amx_bf16")),
    ({"avx2", "avx512f", "avx512_vnni"}, ("fp32", "fp32: cpu flags: no amx_bf16 or avx512_bf16 (bf16 would be "
                                                  "emulated)")),                        # Cascade Lake
    ({"avx2"}, ("fp32", "fp32: cpu flags: no amx_bf16 or avx512_bf16 (bf16 would be emulated)")),
    (set(), ("fp32", "fp32: cpu flags: no amx_bf16 or avx512_bf16 (bf16 would be emulated)")),
])
def test_the_rule_is_a_function_of_the_flags_alone(flags, want):
    assert prec.cpu_rule(flags) == want
    assert prec.cpu_rule(sorted(flags, reverse=True)) == want == prec.cpu_rule(frozenset(flags))     # any order


def test_auto_on_a_cpu_follows_the_rule_and_writes_nothing(unpinned, monkeypatch, tmp_path):
    monkeypatch.setenv("DITTO_FAST_HOME", str(tmp_path))
    for flags, dtype in (({"avx2", "avx512_bf16"}, torch.bfloat16), ({"avx2"}, torch.float32)):
        monkeypatch.setattr(prec, "cpu_flags", lambda flags=flags: frozenset(flags))
        got = [prec.choose_precision("auto", torch.device("cpu")) for _ in range(3)]
        assert got == [(dtype, prec.cpu_rule(flags)[1])] * 3
    assert list(tmp_path.iterdir()) == []
    assert prec.choose_precision("auto", torch.device("cuda")) == (torch.float16, "fp16: on CUDA")     # unchanged
    assert prec.choose_precision("bf16", torch.device("cpu")) == (torch.bfloat16, "bf16: set by --precision")


def test_a_pin_overrides_the_rule_and_a_bad_pin_is_refused(unpinned, monkeypatch):
    from ditto_fast.core.errors import UsageError

    monkeypatch.setattr(prec, "cpu_flags", lambda: frozenset({"avx2"}))
    monkeypatch.setenv(prec.PIN_ENV, "bf16")
    assert prec.cpu_precision() == (torch.bfloat16, "bf16: pinned by DITTO_FAST_CPU_PRECISION")
    monkeypatch.setenv(prec.PIN_ENV, "fp16")
    with pytest.raises(UsageError, match="use fp32 or bf16"):
        prec.cpu_precision()


@pytest.mark.slow
def test_a_render_says_what_auto_chose(engine, clips, tmp_path):
    res = engine.render(RenderRequest("anchor", clips[0], tmp_path / "o.mp4"))
    assert res.timings["precision"] == "float32"
    assert res.timings["precision_choice"] == "fp32: pinned by DITTO_FAST_CPU_PRECISION"


@pytest.mark.slow
def test_two_fresh_stores_choose_alike_and_render_the_same_bytes(unpinned, video_avatar, tiny_checkpoints, clips,
                                                                 tmp_path, run_cli):
    """What the issue measured: two stores on one machine timed a race and rendered different pictures."""
    outs, timings = [], []
    for store in ("a", "b"):
        home = tmp_path / store
        shutil.copytree(video_avatar, home / "avatars" / "anchor")
        out, times = tmp_path / f"{store}.mp4", tmp_path / f"{store}.json"
        r = run_cli(["render", "--avatar", "anchor", "--audio", clips[0], "-o", out, "--device", "cpu",
                     "--timings", times, "--quiet"],
                    env={"DITTO_FAST_HOME": str(home), "DITTO_FAST_CHECKPOINTS": str(tiny_checkpoints)})
        assert r.returncode == 0, r.stderr
        assert sorted(p.name for p in home.iterdir()) == ["avatars"]           # no probes/, nothing else kept
        outs.append(hashlib.sha256(out.read_bytes()).hexdigest())
        timings.append(json.loads(times.read_text()))
    name, why = prec.cpu_rule(prec.cpu_flags())
    assert timings[0]["precision_choice"] == timings[1]["precision_choice"] == why
    assert timings[0]["precision"] == timings[1]["precision"] == str(prec.DTYPES[name]).removeprefix("torch.")
    assert outs[0] == outs[1]
