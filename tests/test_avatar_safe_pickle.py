"""The restricted unpickler: code, other globals and reference bombs refused without running; plain data kept."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from ditto_fast.avatar import load_avatar, safe_pickle
from ditto_fast.core.errors import AvatarError
from hostile import reference_bomb
from support import at_most, reseal_record, write_avatar, write_record


class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_safe_pickle_refuses_malicious_without_executing(tmp_path):
    marker = tmp_path / "pwned"
    data = pickle.dumps({"x": np.zeros(3), "evil": _Evil(marker)}, protocol=5)
    with pytest.raises(AvatarError, match=r"disallowed object (posix|os)\.system"):
        safe_pickle.loads(data)
    assert not marker.exists()
    pickle.loads(data)  # the same bytes really do run the command when unrestricted
    assert marker.exists()


@pytest.mark.parametrize("obj", [eval, getattr, __import__, Path("/x")])
def test_safe_pickle_refuses_other_globals(obj):
    with pytest.raises(AvatarError, match="disallowed object"):
        safe_pickle.loads(pickle.dumps(obj, protocol=2))


def test_safe_pickle_refuses_ordered_dict_and_object_arrays():
    from collections import OrderedDict

    with pytest.raises(AvatarError, match="collections.OrderedDict"):
        safe_pickle.loads(pickle.dumps(OrderedDict(a=1)))
    with pytest.raises(AvatarError, match="object array"):
        safe_pickle.loads(pickle.dumps(np.array([1, "a"], dtype=object)))


@pytest.mark.parametrize("protocol", [4, 5])  # cache files use 5
def test_safe_pickle_accepts_arrays_and_containers(protocol):
    obj = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "f": np.zeros((3, 2), order="F"),
           "s": np.float32(1.5), "i": np.int64(3), "c": 1 + 2j, "set": {1, 2}, "fs": frozenset({3}),
           "t": (1, "x", None, True, b"by"), "l": [1.0, [2]], "u8": np.zeros(4, np.uint8)}
    out = safe_pickle.loads(pickle.dumps(obj, protocol=protocol))
    assert out.keys() == obj.keys()
    np.testing.assert_array_equal(out["a"], obj["a"])
    np.testing.assert_array_equal(out["f"], obj["f"])
    assert out["s"] == np.float32(1.5) and out["c"] == 1 + 2j and out["set"] == {1, 2}
    assert out["t"] == obj["t"] and out["l"] == obj["l"]


def test_safe_pickle_damaged_bytes():
    data = pickle.dumps({"a": np.zeros(100)}, protocol=5)
    with pytest.raises(AvatarError, match="damaged"):
        safe_pickle.loads(data[: len(data) // 2])


def test_malicious_pickle_refused_by_load_avatar(tmp_path):
    """A pickle that would run code is refused without running it, even with a correct format line and CRC."""
    d, _, _ = write_avatar(tmp_path, n=2)
    marker = tmp_path / "pwned"
    write_record(d, {"n_frames": 2, "evil": _Evil(marker)})
    with pytest.raises(AvatarError, match=r"disallowed object .*system.*--name ruby --force"):
        load_avatar("ruby", root=tmp_path)
    assert not marker.exists()
    # a bare pickle (what format 1 looked like) is refused as stale before it is unpickled at all
    (d / "avatar.pkl").write_bytes(pickle.dumps({"kind": "ditto-fast-avatar", "x": _Evil(marker)}))
    with pytest.raises(AvatarError, match="cache format 1"):
        load_avatar("ruby", root=tmp_path)
    assert not marker.exists()


# ----------------------------------------------------------------------------- reference bombs (issue 40)
def _cycle() -> list:
    a: list = [1]
    a.append({"x": a})
    return a


@pytest.mark.parametrize("obj, why", [
    (reference_bomb(60, 2), "nested more than"),            # the probe's bomb: 2^60 paths
    (reference_bomb(5, 1000), "more than 100,000 entries"),  # shallow and wide: 10^15 paths
    ({"source": {"k": reference_bomb(3, 50)}}, "more than 100,000 entries"),
    (_cycle(), "refers to itself"),
])
def test_safe_pickle_refuses_reference_bombs_at_once(obj, why):
    data = pickle.dumps(obj, protocol=5)
    assert len(data) < 100_000
    with at_most(10), pytest.raises(AvatarError, match=why):
        safe_pickle.loads(data)


def test_safe_pickle_accepts_harmless_sharing():
    shared = np.arange(3.0)
    body = {"a": shared, "b": [shared, (), ()], "c": ((), "x"), "d": [[1, 2]] * 100}
    out = safe_pickle.loads(pickle.dumps(body, protocol=5))
    assert out["d"][99] == [1, 2] and out["b"][0] is out["a"]


def test_reference_bomb_in_avatar_pkl_is_refused(tmp_path, run_cli):
    d, _, _ = write_avatar(tmp_path, n=2)
    reseal_record(d, lambda body: body["source"].update(notes=reference_bomb(60, 2)))
    env = {"DITTO_FAST_HOME": str(tmp_path)}
    with at_most(20):
        with pytest.raises(AvatarError, match=r"avatar\.pkl is not an avatar record .*ditto-fast register"):
            load_avatar("ruby", root=tmp_path)
        r = run_cli(["avatars", "show", "ruby"], env)
        assert r.returncode == 5 and r.stderr.count("\n") == 1 and "not an avatar record" in r.stderr, r.stderr
        r = run_cli(["avatars"], env)
        assert "ruby" in r.stdout and "not an avatar record" in r.stdout, r.stdout
