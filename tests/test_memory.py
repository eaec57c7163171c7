"""The render loop's malloc policy: activations freed in one frame are reused by the next, not faulted in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import resource, sys
import torch
from ditto_fast import memory, models
getattr(memory, sys.argv[1])()
decoder = models.build("decoder", tiny=True).eval()      # still 2-8 MiB activations at 256x256 and 512x512
decoder.fuse_for_inference()
feature = torch.randn(1, 8, 64, 64)
def faults_of_one_frame():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    with torch.inference_mode():
        decoder(feature)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_one_frame()
print(min(faults_of_one_frame() for _ in range(3)))
"""


def _faults(policy: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, policy], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc policy")
def test_render_policy_reuses_freed_tensors_and_the_streaming_one_does_not():
    reused, fresh = _faults("reuse_freed_memory"), _faults("serve_frames_from_mmap")
    assert fresh > 1000                     # every large activation a fresh mmap, faulted in page by page
    assert reused < fresh // 20             # served again from the kept heap
