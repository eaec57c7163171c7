"""Motion extractor: parity with the reference vectors, layout, bf16, tiny round trip."""

import pytest
import torch

from ditto_fast import models
from ditto_fast.models import motion_extractor
from conftest import assert_close_to_ref, layout_shapes, native_bf16

HEADS = ("pitch", "yaw", "roll", "t", "exp", "scale", "kp")


@pytest.fixture(scope="module")
def image(parity_vectors):
    return torch.from_numpy(parity_vectors["motion_extractor.in.image"])


def test_motion_extractor_parity(parity_checkpoint, parity_vectors, image):
    net = models.load("motion_extractor", parity_checkpoint("motion_extractor"))
    with torch.no_grad():
        out = net(image)
    assert set(out) == set(HEADS)
    for name in HEADS:
        assert out[name].dtype == torch.float32
        assert_close_to_ref(out[name].numpy(), parity_vectors[f"motion_extractor.out.{name}"], f"motion_extractor.{name}")


@native_bf16
@pytest.mark.slow
def test_motion_extractor_bf16_close_to_reference(parity_checkpoint, parity_vectors, image):
    net = models.load("motion_extractor", parity_checkpoint("motion_extractor"), dtype=torch.bfloat16)
    assert net.detector.fc_kp.weight.dtype == torch.bfloat16
    with torch.no_grad():
        out = net(image)
    for name in HEADS:
        assert_close_to_ref(out[name].numpy(), parity_vectors[f"motion_extractor.out.{name}"],
                            f"motion_extractor bf16 {name}", rel=2e-2)


def test_motion_extractor_full_size_matches_layout(parity_layout):
    layout = parity_layout["motion_extractor"]
    with torch.device("meta"):                 # shapes only: no weights drawn
        sd = models.build("motion_extractor").state_dict()
    assert {k: list(v.shape) for k, v in sd.items()} == {k: v["shape"] for k, v in layout["keys"].items()}
    assert sum(v.numel() for v in sd.values()) == layout["num_params"]


def test_motion_extractor_widths_from_state_dict(parity_layout):
    sd = layout_shapes(parity_layout["motion_extractor"]["keys"])          # the published shapes (it reads no values)
    assert motion_extractor.widths_from_state_dict(sd) == {
        "dims": (96, 192, 384, 768), "depths": (3, 3, 9, 3), "num_kp": 21, "num_bins": 66}
    tiny = models.build("motion_extractor", tiny=True).state_dict()
    assert motion_extractor.widths_from_state_dict(tiny)["dims"] == motion_extractor.TINY_WIDTHS["dims"]


def test_motion_extractor_tiny_round_trip(tmp_path):
    torch.manual_seed(0)
    net = models.build("motion_extractor", tiny=True).eval()
    torch.save(net.state_dict(), tmp_path / "m.pth")
    loaded = models.load("motion_extractor", tmp_path / "m.pth")
    img = torch.rand(2, 3, 256, 256, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = loaded(img), net(img)
    assert a["pitch"].shape == (2, 66) and a["kp"].shape == (2, 63) and a["scale"].shape == (2, 1)
    for name in HEADS:
        torch.testing.assert_close(a[name], b[name])
    # rows are independent: the batch gives what each image gives alone
    with torch.no_grad():
        single = loaded(img[1:])
    torch.testing.assert_close(single["exp"], a["exp"][1:], rtol=1e-4, atol=1e-5)
