"""Random checkpoints in the published layout, discovery, fingerprints, and every bad-file error."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from ditto_fast import models
from ditto_fast.checkpoints import MODELS_SUBDIR, find_checkpoints
from ditto_fast.checkpoints.random_weights import random_state_dict
from ditto_fast.cli import main
from ditto_fast.core.errors import CheckpointError


def test_tiny_set_loads_every_network(tiny_checkpoints):
    cs = find_checkpoints(tiny_checkpoints)
    assert cs.random_weights
    for name, path in cs.files.items():
        net = models.load(name, path)
        assert net.ditto_meta.get("random_weights") is True, name
        assert not net.training
    fp = cs.fingerprints()
    assert set(fp) == set(models.NETWORK_NAMES) | {"hubert"} and all(len(v) == 16 for v in fp.values())


@pytest.mark.slow
def test_full_size_random_layout_matches_published(parity_layout):
    for name in models.NETWORK_NAMES:
        sd = random_state_dict(name, tiny=False, seed=0)
        want = {k: tuple(v["shape"]) for k, v in parity_layout[name]["keys"].items()}
        assert {k: tuple(v.shape) for k, v in sd.items()} == want, name
        del sd


def test_random_is_deterministic_per_seed():
    a = random_state_dict("stitch_network", tiny=True, seed=1)
    b = random_state_dict("stitch_network", tiny=True, seed=1)
    c = random_state_dict("stitch_network", tiny=True, seed=2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_cli_init_random_tiny(tmp_path, capsys):
    mask = os.umask(0o027)
    try:
        main(["checkpoints", "init-random", str(tmp_path / "ck"), "--tiny", "--seed", "3"])
    finally:
        os.umask(mask)
    assert "random checkpoints (seed 3)" in capsys.readouterr().out
    cs = find_checkpoints(tmp_path / "ck")
    assert all(p.is_file() for p in cs.files.values())
    assert (cs.hubert_dir / "config.json").is_file()
    # one mode for every file it writes, the umask's (HuBERT's model.safetensors was 0600, the rest 0644)
    modes = {p.relative_to(tmp_path).as_posix(): oct(p.stat().st_mode & 0o777) for p in (tmp_path / "ck").rglob("*")
             if p.is_file()}
    assert (cs.hubert_dir / "model.safetensors").is_file() and set(modes.values()) == {oct(0o640)}, modes


@pytest.fixture()
def ckpt_copy(tiny_checkpoints, tmp_path):
    dst = tmp_path / "ck"
    shutil.copytree(tiny_checkpoints, dst)
    return dst


def _expect(match, fn):
    with pytest.raises(CheckpointError, match=match) as e:
        fn()
    assert "\n" not in str(e.value)
    return str(e.value)


def test_missing_dir_and_files(tmp_path, ckpt_copy):
    _expect("checkpoint directory not found", lambda: find_checkpoints(tmp_path / "nope"))
    (ckpt_copy / MODELS_SUBDIR / "decoder.pth").unlink()
    msg = _expect("checkpoint file missing", lambda: find_checkpoints(ckpt_copy))
    assert "decoder.pth" in msg and "init-random" in msg


def test_bad_files_name_file_and_network(ckpt_copy):
    d = ckpt_copy / MODELS_SUBDIR
    warp = d / "warp_network.pth"
    # truncated
    data = warp.read_bytes()
    warp.write_bytes(data[: len(data) // 2])
    msg = _expect("truncated or corrupt", lambda: models.load("warp_network", warp))
    assert str(warp) in msg and "warping network" in msg
    # empty
    warp.write_bytes(b"")
    _expect("empty file", lambda: models.load("warp_network", warp))
    # text file
    warp.write_text("hello, not a checkpoint")
    _expect("truncated or corrupt", lambda: models.load("warp_network", warp))
    # a directory
    _expect("is a directory", lambda: models.load("warp_network", d))
    # the decoder file given as the warp network
    _expect("this is a SPADE decoder checkpoint, not the warping network",
            lambda: models.load("warp_network", d / "decoder.pth"))


def test_wrong_shapes_and_keys(ckpt_copy):
    d = ckpt_copy / MODELS_SUBDIR
    obj = torch.load(d / "stitch_network.pth", weights_only=True)
    sd = obj["retarget_shoulder"]
    sd["mlp.2.weight"] = torch.zeros(3, 3)
    torch.save(obj, d / "stitch_network.pth")
    msg = _expect("does not match the stitching network", lambda: models.load("stitch_network", d / "stitch_network.pth"))
    assert "mlp.2.weight" in msg
    del sd["mlp.2.weight"]
    torch.save(obj, d / "stitch_network.pth")
    _expect("missing mlp.2.weight", lambda: models.load("stitch_network", d / "stitch_network.pth"))
    torch.save({"something_else": 1}, d / "stitch_network.pth")
    _expect("not a stitching network checkpoint", lambda: models.load("stitch_network", d / "stitch_network.pth"))


def test_module_prefix_is_stripped(tmp_path):
    net = models.build("stitch_network", tiny=True)
    torch.save({"retarget_shoulder": {"module." + k: v for k, v in net.state_dict().items()}}, tmp_path / "s.pth")
    loaded = models.load("stitch_network", tmp_path / "s.pth", fuse=False).state_dict()
    want = net.state_dict()
    assert list(loaded) == list(want) and all(torch.equal(loaded[k], want[k]) for k in want)


class _RunsCode:
    """Pickles as a call of os.system: what a booby-trapped .pth holds."""

    def __reduce__(self):
        import os

        return (os.system, ("echo this should never run",))


def test_a_pickle_that_runs_code_is_refused_in_one_whole_sentence(ckpt_copy, tmp_path, capfd):
    path = ckpt_copy / MODELS_SUBDIR / "stitch_network.pth"
    torch.save({"retarget_shoulder": _RunsCode()}, path)
    msg = _expect("not a plain weights file; refused to load it", lambda: models.load("stitch_network", path))
    assert str(path) in msg and "system" in msg and msg.endswith("file from the Ditto release")
    out = capfd.readouterr()
    assert "should never run" not in out.out + out.err and "Warning" not in out.err
    import pickle

    class _Eval:
        def __reduce__(self):
            return (eval, ("1+1",))

    path.write_bytes(pickle.dumps({"a": _Eval()}, protocol=4))                 # a legacy pickle, no zip
    _expect("not a plain weights file; refused to load it", lambda: models.load("stitch_network", path))


def test_weights_holding_nan_are_refused(ckpt_copy):
    path = ckpt_copy / MODELS_SUBDIR / "stitch_network.pth"
    obj = torch.load(path, weights_only=True)
    obj["retarget_shoulder"]["mlp.0.weight"][0, 0] = float("nan")
    torch.save(obj, path)
    msg = _expect("mlp.0.weight holds NaN or infinite values", lambda: models.load("stitch_network", path))
    assert str(path) in msg
