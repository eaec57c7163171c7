"""Stitching network: parity with the reference vectors, tiny build round trip."""

import torch

from ditto_fast import models
from conftest import assert_close_to_ref


def test_stitch_parity(parity_checkpoint, parity_vectors):
    net = models.load("stitch_network", parity_checkpoint("stitch_network"))
    v = parity_vectors
    out = net(torch.from_numpy(v["stitch_network.in.kp_source"]), torch.from_numpy(v["stitch_network.in.kp_driving"]))
    assert_close_to_ref(out.numpy(), v["stitch_network.out.kp_driving_new"], "stitch_network")


def test_stitch_tiny_round_trip(tmp_path):
    net = models.build("stitch_network", tiny=True)
    torch.save({"retarget_shoulder": net.state_dict()}, tmp_path / "s.pth")
    loaded = models.load("stitch_network", tmp_path / "s.pth")
    x, y = torch.randn(2, 21, 3), torch.randn(2, 21, 3)
    torch.testing.assert_close(loaded(x, y), net.eval()(x, y))
