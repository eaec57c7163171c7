"""The server's options, declared once (serve/options.py): `serve`'s command-line options are made from them, and a
ServeOptions made in Python is checked as the command line is."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from ditto_fast.core.errors import UsageError
from ditto_fast.serve.options import DEFAULT_PORT, SERVE_FIELDS, ServeOptions


def test_serve_takes_every_declared_option():
    from ditto_fast.cli import serve

    opts = {p.name: p for p in serve.params}
    flagged = [f for f in SERVE_FIELDS if f.metadata.get("flags")]
    assert {f.name for f in SERVE_FIELDS} - {f.name for f in flagged} == {"defaults", "quiet"}
    for f in flagged:
        assert opts[f.name].opts == list(f.metadata["flags"]), f.name
    assert (opts["port"].default, opts["port"].type.min, opts["port"].type.max) == (DEFAULT_PORT, 1, 65535)
    assert opts["roots"].multiple and opts["settle_s"].type.min == 0.5


@pytest.mark.parametrize("given, said", [
    ({"port": 0}, "port must be in 1..65535, got 0"),
    ({"port": True}, "port must be an integer in 1..65535, got True"),
    ({"port": "8750"}, "port must be an integer in 1..65535, got '8750'"),
    ({"settle_s": 0.1}, "settle_s must be in 0.5..600, got 0.1"),
    ({"workers": 0}, "workers must be in 1..1024, got 0"),
    ({"roots": ["a", 3]}, "roots must be a file path, got 3"),
    ({"watch": ""}, "watch must be a file path, got ''"),
    ({"host": 127}, "host must be a string, got 127"),
])
def test_options_made_in_python_are_refused_when_made(given, said):
    with pytest.raises(UsageError, match=f"^{said}$"):
        ServeOptions(**given)


def test_good_options_are_normalised():
    opts = ServeOptions(port=8000, settle_s=1, roots=("a", Path("b")), watch="in", out="out",
                        defaults={"emotion": "happy", "controls": Path("c.json"), "seed": None})
    assert (opts.settle_s, opts.roots, opts.watch) == (1.0, [Path("a"), Path("b")], Path("in"))
    assert opts.defaults == {"emotion": "happy", "controls": str(Path("c.json").absolute())}
    assert pickle.loads(pickle.dumps(opts)) == opts
