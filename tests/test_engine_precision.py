"""`--precision auto` on a CPU: fp32 without bf16 arithmetic; elsewhere one probe per CPU kind, kept in the store."""

from __future__ import annotations

import json

import pytest
import torch

from ditto_fast.engine.request import RenderRequest
from ditto_fast.checkpoints import find_checkpoints
from ditto_fast.engine import precision as prec


@pytest.fixture()
def tiny_set(tiny_checkpoints, monkeypatch):
    monkeypatch.delenv(prec.PIN_ENV, raising=False)        # the suite pins fp32 (conftest); these tests choose
    return find_checkpoints(tiny_checkpoints)


def test_cpu_kind_reads_this_machine():
    kind = prec.cpu_kind()
    assert kind["model"] and set(kind["flags"]) <= {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}


def test_no_bf16_arithmetic_means_fp32_without_a_probe(tiny_set, tmp_path, monkeypatch):
    monkeypatch.setattr(prec, "cpu_kind", lambda: {"model": "AMD EPYC", "flags": ["avx2"]})
    monkeypatch.setattr(prec, "probe", lambda *a, **k: pytest.fail("probed a CPU without bf16 arithmetic"))
    dtype, why = prec.cpu_precision(tiny_set, tmp_path)
    assert dtype == torch.float32 and "no bf16 arithmetic" in why
    assert not (tmp_path / "probes").exists()


def test_the_verdict_is_probed_once_and_kept(tiny_set, tmp_path, monkeypatch):
    calls = []

    def fake_probe(warp, decoder, min_psnr_db=prec.MIN_PSNR_DB):
        calls.append((warp, decoder))
        return {"fp32_s": 3.0, "bf16_s": 1.4, "psnr_db": 52.0, "min_psnr_db": min_psnr_db, "chosen": "bf16"}

    monkeypatch.setattr(prec, "cpu_kind", lambda: {"model": "Xeon", "flags": ["amx_bf16", "avx512_bf16"]})
    monkeypatch.setattr(prec, "probe", fake_probe)
    for _ in range(2):
        dtype, why = prec.cpu_precision(tiny_set, tmp_path)
        assert dtype == torch.bfloat16 and "52.0 dB" in why and "bf16 1.40 s" in why
    assert len(calls) == 1
    kept = list((tmp_path / "probes").glob("precision-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["cpu"]["model"] == "Xeon"
    # another CPU kind probes again; a damaged verdict is probed again and replaced
    monkeypatch.setattr(prec, "cpu_kind", lambda: {"model": "EPYC", "flags": ["avx512_bf16"]})
    prec.cpu_precision(tiny_set, tmp_path)
    assert len(calls) == 2 and len(list((tmp_path / "probes").glob("*.json"))) == 2
    kept[0].write_text("{not json")
    monkeypatch.setattr(prec, "cpu_kind", lambda: {"model": "Xeon", "flags": ["amx_bf16", "avx512_bf16"]})
    assert prec.cpu_precision(tiny_set, tmp_path)[0] == torch.bfloat16 and len(calls) == 3


def test_the_probe_times_both_and_holds_bf16_to_the_psnr(tiny_set):
    got = prec.probe(tiny_set.files["warp_network"], tiny_set.files["decoder"], min_psnr_db=200.0)
    assert got["fp32_s"] > 0 and got["bf16_s"] > 0
    assert 20.0 < got["psnr_db"] < 200.0 and got["chosen"] == "fp32"       # bf16 is not fp32's bytes


def test_a_pin_overrides_the_probe_and_a_bad_pin_is_refused(tiny_set, tmp_path, monkeypatch):
    from ditto_fast.core.errors import UsageError

    monkeypatch.setattr(prec, "probe", lambda *a, **k: pytest.fail("probed although pinned"))
    monkeypatch.setenv(prec.PIN_ENV, "bf16")
    assert prec.cpu_precision(tiny_set, tmp_path) == (torch.bfloat16, "bf16: pinned by DITTO_FAST_CPU_PRECISION")
    monkeypatch.setenv(prec.PIN_ENV, "fp16")
    with pytest.raises(UsageError, match="use fp32 or bf16"):
        prec.cpu_precision(tiny_set, tmp_path)


@pytest.mark.slow
def test_a_render_says_what_auto_chose(engine, clips, tmp_path):
    res = engine.render(RenderRequest("anchor", clips[0], tmp_path / "o.mp4"))
    assert res.timings["precision"] == "float32"
    assert res.timings["precision_choice"] == "fp32: pinned by DITTO_FAST_CPU_PRECISION"
