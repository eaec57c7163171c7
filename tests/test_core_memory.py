"""The render loop's malloc policy: activations freed in one frame are reused by the next, not faulted in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import resource, sys
import torch
from ditto_fast import models
from ditto_fast.core import memory
if sys.argv[1] == "mmap":
    import ctypes
    ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)         # M_MMAP_THRESHOLD 1 MiB: the policy before this one
else:
    memory.reuse_freed_memory()
decoder = models.build("decoder", tiny=True).eval()      # still 2-8 MiB activations at 256x256 and 512x512
decoder.fuse_for_inference()
feature = torch.randn(1, 8, 64, 64)
def faults_of_one_frame():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    with torch.inference_mode():
        decoder(feature)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_one_frame()
kept = min(faults_of_one_frame() for _ in range(3))
memory.release_free_memory()
print(kept, faults_of_one_frame())                   # after a release the next frame faults its pages in again
"""


def _faults(policy: str) -> tuple[int, int]:
    """(page faults of a frame in steady state, those of the frame after release_free_memory)."""
    out = subprocess.run([sys.executable, "-c", PROBE, policy], capture_output=True, text=True, check=True)
    kept, released = out.stdout.strip().splitlines()[-1].split()
    return int(kept), int(released)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc policy")
def test_freed_activations_are_reused_until_released():
    (reused, released), (fresh, _) = _faults("reuse_freed_memory"), _faults("mmap")
    assert fresh > 1000                     # every large activation a fresh mmap, faulted in page by page
    assert reused < fresh // 20             # served again from the kept heap
    assert released > fresh // 4            # release_free_memory gave the pages back to the OS
