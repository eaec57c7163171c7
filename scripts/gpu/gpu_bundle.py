#!/usr/bin/env python
"""Build what scripts/gpu_check.sh carries to a bare GPU machine (its own Python and torch, no registry, no
ffmpeg, no mediapipe), on this machine's pinned .venv:

    .venv/bin/python scripts/gpu/gpu_bundle.py [--out gpu_bundle] [--limit-mib 64]

The bundle is self-contained: the project's files (ditto_fast/, configs/, scripts/, the test speech), the putback
kernel built for every CPython 3.10-3.13 found here, `bundle/ffmpeg.xz` (imageio-ffmpeg's ffmpeg, with
libx264 and NVENC), `bundle/site/` (the small pure-Python packages and soxr that such an image lacks; the
machine's own copies win), and two 1920x1080 image avatars registered here, since registration needs
mediapipe: one with full-size random extractors, one with tiny (for `--device cpu --tiny`). The checkpoints
themselves are not carried: gpu_check.sh writes them there with `ditto-fast checkpoints init-random`.
Prints the size; exits 1 when it is over the limit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "support"))
sys.path.insert(0, str(REPO))

PROJECT = ("ditto_fast", "configs", "scripts", "pyproject.toml", "setup.py", "README.md", "tests/data/speech_en_16k.wav")
PURE_SITE = ("click", "threadpoolctl", "imageio_ffmpeg", "tqdm", "yaml")   # copied from this environment
SOXR_PYTHONS = ("3.10", "3.11", "3.12")                                   # soxr's 3.12 wheel is abi3: 3.12+
CACHE = Path(os.environ.get("DITTO_FAST_BENCH_CACHE", REPO / "bench_out" / "cache"))


def project_files() -> list[Path]:
    """The tracked and new (not ignored) files of the project that a render needs, relative to the repo."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *PROJECT],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout.split("\n")
    return [Path(p) for p in out if p and (REPO / p).is_file()]


def copy_project(dest: Path) -> None:
    for rel in project_files():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest / rel)


def interpreters() -> list[Path]:
    """CPython 3.10-3.13 executables found here (the PATH's, and pyenv's versions)."""
    found: dict[str, Path] = {}
    cands = [shutil.which(f"python3.{m}") for m in (10, 11, 12, 13)] + [sys.executable]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    cands += [str(p) for p in sorted(pyenv.glob("3.1[0-3].*/bin/python3"))]
    for c in filter(None, cands):
        try:
            res = subprocess.run([c, "-c", "import sys, sysconfig; print('%d.%d' % sys.version_info[:2], "
                                  "sysconfig.get_config_var('EXT_SUFFIX'), sysconfig.get_paths()['include'])"],
                                 capture_output=True, text=True, timeout=20)
        except OSError:
            continue
        if res.returncode == 0:
            ver, suffix, include = res.stdout.split()
            if ver in ("3.10", "3.11", "3.12", "3.13") and (Path(include) / "Python.h").is_file():
                found.setdefault(suffix, Path(c))
    return list(found.values())


def build_kernels(dest: Path) -> list[str]:
    """The Cython putback kernel compiled for each interpreter found (one C file, one .so per ABI)."""
    from Cython.Build import cythonize

    with tempfile.TemporaryDirectory() as tmp:
        pyx = Path(tmp) / "_blend.pyx"
        shutil.copy(REPO / "ditto_fast" / "render" / "_blend.pyx", pyx)
        cythonize([str(pyx)], compiler_directives={"language_level": "3", "boundscheck": False,
                                                   "wraparound": False}, quiet=True)
        built = []
        for py in interpreters():
            suffix, include = subprocess.run(
                [str(py), "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'), "
                 "sysconfig.get_paths()['include'])"], capture_output=True, text=True, check=True).stdout.split()
            so = dest / "ditto_fast" / "render" / f"_blend{suffix}"
            cc = os.environ.get("CC", "cc")
            res = subprocess.run([cc, "-O3", "-shared", "-fPIC", f"-I{include}", str(pyx.with_suffix(".c")),
                                  "-o", str(so)], capture_output=True, text=True)
            if res.returncode == 0:
                built.append(suffix)
        return built


def ffmpeg_xz(dest: Path) -> Path:
    """imageio-ffmpeg's ffmpeg, xz-compressed (cached by the binary's hash: compressing takes minutes)."""
    import imageio_ffmpeg

    exe = Path(imageio_ffmpeg.get_ffmpeg_exe())
    h = hashlib.sha256()
    with open(exe, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    cached = CACHE / f"ffmpeg-{h.hexdigest()[:16]}.xz"
    if not cached.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp")
        if shutil.which("xz"):
            with open(tmp, "wb") as out:
                subprocess.run(["xz", "-6", "-T0", "-c", str(exe)], stdout=out, check=True)
        else:
            import lzma

            tmp.write_bytes(lzma.compress(exe.read_bytes(), preset=6))
        os.replace(tmp, cached)
    out = dest / "bundle" / "ffmpeg.xz"
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(cached, out)
    (dest / "bundle" / "ffmpeg.json").write_text(json.dumps({"name": exe.name, "sha256": h.hexdigest()}) + "\n")
    return out


def site_packages(dest: Path) -> list[str]:
    """PURE_SITE copied from this environment (imageio-ffmpeg without its binary) and soxr's wheels unpacked."""
    import importlib

    site = dest / "bundle" / "site"
    site.mkdir(parents=True, exist_ok=True)
    got = []
    for name in PURE_SITE:
        src = Path(importlib.import_module(name).__file__)
        if src.name == "__init__.py":                          # a package: its folder, without binaries
            shutil.copytree(src.parent, site / name, ignore=shutil.ignore_patterns("__pycache__", "binaries", "*.so"))
        else:                                                  # a single module (threadpoolctl)
            shutil.copy(src, site / src.name)
        got.append(name)
    with tempfile.TemporaryDirectory() as tmp:
        for ver in SOXR_PYTHONS:
            res = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                                  "--python-version", ver, "--platform", "manylinux_2_28_x86_64", "-d", tmp,
                                  "soxr>=0.3,<2"], capture_output=True, text=True)
            if res.returncode != 0:
                continue
        for whl in sorted(Path(tmp).glob("soxr-*.whl")):
            with zipfile.ZipFile(whl) as z:
                z.extractall(site)
            got.append(whl.name)
    return got


def weights_digest(path: Path) -> str:
    """sha256 of a checkpoint's tensors (names, dtypes, shapes, values): equal for the same weights whatever
    torch wrote the file (file fingerprints also hash torch.save's container)."""
    import torch

    tensors: dict[str, torch.Tensor] = {}

    def walk(obj: object, prefix: str) -> None:
        if isinstance(obj, torch.Tensor):
            tensors[prefix] = obj
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{prefix}/{k}")

    walk(torch.load(path, map_location="cpu", weights_only=True), "")
    h = hashlib.sha256()
    for key in sorted(tensors):
        t = tensors[key].contiguous()
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def make_avatars(dest: Path) -> dict:
    """Two image avatars of one 1920x1080 astronaut frame: 'full' (full-size extractors) and 'tiny'."""
    import cv2

    from ditto_fast.avatar.register import Registrar
    from ditto_fast.checkpoints import MODELS_SUBDIR
    from ditto_fast.checkpoints.random_weights import write_random
    from ditto_fast.models import SPECS
    from synthetic import astronaut_canvas

    nets = ("appearance_extractor", "motion_extractor")
    info = {}
    with tempfile.TemporaryDirectory() as tmp:
        png = Path(tmp) / "anchor.png"
        cv2.imwrite(str(png), cv2.cvtColor(astronaut_canvas(0, size=(1920, 1080)), cv2.COLOR_RGB2BGR))
        for size in ("full", "tiny"):
            ckpt = write_random(Path(tmp) / f"ckpt_{size}", tiny=size == "tiny", seed=0, networks=nets, hubert=False)
            os.environ["DITTO_FAST_HOME"] = str(Path(tmp) / f"home_{size}")
            d = Registrar(ckpt, "cpu").register(png, "gpu_check", force=True)
            shutil.copytree(d, dest / "bundle" / "avatars" / size)
            info[size] = {n: weights_digest(ckpt / MODELS_SUBDIR / SPECS[n].filename) for n in nets}
    return info


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "gpu_bundle")
    ap.add_argument("--limit-mib", type=float, default=64.0)
    args = ap.parse_args(argv)
    os.environ.setdefault("DITTO_FAST_CPU_PRECISION", "fp32")
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    copy_project(args.out)
    kernels = build_kernels(args.out)
    ffmpeg_xz(args.out)
    site = site_packages(args.out)
    digests = make_avatars(args.out)
    import numpy
    import torch

    manifest = {"built_with": {"torch": torch.__version__, "numpy": numpy.__version__}, "kernels": kernels,
                "site": site, "avatar_weights": digests}
    (args.out / "bundle" / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    parts = {"project": tree_bytes(args.out) - tree_bytes(args.out / "bundle"),
             "ffmpeg.xz": (args.out / "bundle" / "ffmpeg.xz").stat().st_size,
             "site": tree_bytes(args.out / "bundle" / "site"),
             "avatars": tree_bytes(args.out / "bundle" / "avatars")}
    total = tree_bytes(args.out)
    mib = total / 2**20
    print("gpu bundle " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in parts.items())
          + f": {mib:.1f} MiB in all (limit {args.limit_mib:g} MiB) at {args.out}; kernels for {', '.join(kernels)}")
    if mib > args.limit_mib:
        print(f"gpu_bundle: {mib:.1f} MiB is over the {args.limit_mib:g} MiB that can be carried", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
