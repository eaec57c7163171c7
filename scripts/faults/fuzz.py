#!/usr/bin/env python
"""Fuzz campaign: mutated audio (WAV, MP3) into `render`, mutated sources (MP4, PNG, JPEG) into `register`, and a
fixed list of hostile inputs (FIFOs, device files, YAML alias bombs, a pickle reference bomb, NaN features, deep
JSON, side files named as inputs) each with the exit code it must give.

    python scripts/faults/fuzz.py [--n 200] [--seed 0] [--timeout 180] [--jobs 1] [--json fuzz.json] [--keep DIR]
    python scripts/faults/fuzz.py --only render:17 --seed 0        # replay one case (hostile:NAME for a hostile one)

Mutations: byte flips, truncations, header fields set to extremes (WAV fmt/data, PNG IHDR, JPEG SOF, MP4
boxes), zero-length streams, spliced bytes. Tiny random checkpoints, CPU. Each run is a real
`python -m ditto_fast.cli` process with a time limit and must end with exit 0, 3 or 4: never 1 (a bug),
never a hang, never anything partial at its output (a hidden .part file, a half avatar, a .tmp-* in the
store). Prints the counts, writes every case to the JSON, and copies failing inputs to --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "support"))   # the synthetic anchor, hostile inputs
from hostile import alias_bomb, reference_bomb  # noqa: E402 - from scripts/support
OK_CODES = (0, 3, 4)
MEMORY_LIMIT = 6 << 30        # address space of each run: an unbounded read fails (exit 1) instead of filling the host
MUTATIONS = ("flip", "truncate", "header", "zero", "splice")
EXTREMES = (0, 1, 2, 3, 0x7F, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF)


@dataclass
class Case:
    command: str          # render, register or hostile
    index: int
    seed_file: str
    mutation: str
    detail: str
    exit_code: int | None = None
    seconds: float = 0.0
    verdict: str = ""     # ok, bad_exit, hang, leftover
    problem: str = ""
    stderr_tail: str = ""


# ----------------------------------------------------------------------------- seed inputs
def make_seeds(work: Path) -> dict[str, list[Path]]:
    """Small valid inputs of each kind (audio for render, sources for register)."""
    import cv2
    import imageio_ffmpeg
    import soundfile as sf

    from synthetic import Motion, astronaut_canvas, write_anchor_video

    ff = imageio_ffmpeg.get_ffmpeg_exe()
    d = work / "seeds"
    d.mkdir(parents=True, exist_ok=True)
    x, sr = sf.read(REPO / "tests" / "data" / "speech_en_16k.wav", dtype="float32")
    sf.write(d / "speech.wav", x[sr:int(1.6 * sr)], sr, subtype="PCM_16")

    def ffmpeg(*args: str) -> None:
        subprocess.run([ff, "-hide_banner", "-loglevel", "error", "-y", *args], check=True)

    ffmpeg("-i", str(d / "speech.wav"), "-ac", "2", "-ar", "44100", "-c:a", "pcm_f32le", str(d / "stereo.wav"))
    ffmpeg("-i", str(d / "speech.wav"), "-c:a", "libmp3lame", "-b:a", "64k", str(d / "speech.mp3"))
    size = (1280, 720)                     # the face as in the tests' small anchors (mediapipe finds it)
    motion = Motion(center=(640, 360), velocity=(0.5, 0.0))
    write_anchor_video(d / "anchor.mp4", 8, size=size, face_px=120, motion=motion)
    ffmpeg("-i", str(d / "anchor.mp4"), "-f", "lavfi", "-i", "sine=f=300:d=0.32", "-c:v", "copy", "-c:a", "aac",
           "-movflags", "+faststart", "-shortest", str(d / "anchor_faststart.mp4"))
    still = cv2.cvtColor(astronaut_canvas(0, Motion.for_face(120, center=(640, 360)), size), cv2.COLOR_RGB2BGR)
    cv2.imwrite(str(d / "anchor.png"), still)
    cv2.imwrite(str(d / "anchor.jpg"), still, [cv2.IMWRITE_JPEG_QUALITY, 90])
    return {"render": [d / "speech.wav", d / "stereo.wav", d / "speech.mp3"],
            "register": [d / "anchor.mp4", d / "anchor_faststart.mp4", d / "anchor.png", d / "anchor.jpg"]}


# ----------------------------------------------------------------------------- mutations
def _mp4_boxes(data: bytes) -> list[tuple[int, bytes]]:
    """(offset, type) of the ISO-BMFF boxes found by their 4-character types."""
    kinds = (b"moov", b"mvhd", b"trak", b"tkhd", b"mdhd", b"hdlr", b"stsd", b"avcC", b"stts", b"stss", b"stsc",
             b"stsz", b"stco", b"mdat", b"ftyp", b"elst", b"esds")
    found = []
    for kind in kinds:
        start = 0
        while (i := data.find(kind, start)) >= 4:
            found.append((i - 4, kind))
            start = i + 1
    return found


def _header_fields(data: bytes, suffix: str) -> list[tuple[int, int, str]]:
    """(offset, width in bytes, name) of header fields worth setting to extremes, by format."""
    if data[:4] == b"RIFF":
        return [(4, 4, "riff_size"), (20, 2, "format"), (22, 2, "channels"), (24, 4, "rate"), (28, 4, "byte_rate"),
                (32, 2, "block_align"), (34, 2, "bits"), (40, 4, "data_size")]
    if data[:4] == b"\x89PNG":
        return [(16, 4, "width"), (20, 4, "height"), (24, 1, "bit_depth"), (25, 1, "colour_type"), (8, 4, "ihdr_len")]
    if data[:2] == b"\xff\xd8":
        sof = max(data.find(b"\xff\xc0"), data.find(b"\xff\xc2"))
        return [(sof + 5, 2, "height"), (sof + 7, 2, "width"), (sof + 9, 1, "components"), (sof + 2, 2, "sof_len")] \
            if sof > 0 else []
    if suffix == ".mp3":
        sync = data.find(b"\xff\xfb")
        return [(sync + 2, 1, "bitrate_rate"), (sync + 1, 1, "version_layer"), (6, 4, "id3_size")] if sync >= 0 else []
    fields = []
    for off, kind in _mp4_boxes(data):
        fields.append((off, 4, f"{kind.decode()}.size"))
        for k in range(1, 6):
            fields.append((off + 8 + 4 * k, 4, f"{kind.decode()}+{4 * k}"))
    return [f for f in fields if f[0] + f[1] <= len(data)]


def mutate(data: bytes, suffix: str, mutation: str, rng: random.Random) -> tuple[bytes, str]:
    """The mutated bytes and a description of what was done."""
    b = bytearray(data)
    if mutation == "flip":
        k = rng.choice((1, 2, 4, 16, 64))
        lo = 0 if rng.random() < 0.5 else len(b) // 2        # half the time in the headers
        hi = min(len(b), lo + (4096 if lo == 0 else len(b)))
        spots = sorted(rng.randrange(lo, hi) for _ in range(k))
        for i in spots:
            b[i] ^= 1 << rng.randrange(8)
        return bytes(b), f"{k} bit flips at {spots[:4]}{'...' if k > 4 else ''}"
    if mutation == "truncate":
        cut = rng.choice((rng.randrange(1, 64), rng.randrange(len(b)), len(b) // 2, len(b) - 1))
        return bytes(b[:cut]), f"cut to {cut} of {len(b)} bytes"
    if mutation == "header":
        fields = _header_fields(data, suffix)
        if not fields:
            return mutate(data, suffix, "flip", rng)
        off, width, name = rng.choice(fields)
        value = rng.choice(EXTREMES) & ((1 << (8 * width)) - 1)
        big_endian = not data[:4] == b"RIFF"
        fmt = {1: "B", 2: "H", 4: "I"}[width]
        b[off:off + width] = struct.pack((">" if big_endian else "<") + fmt, value)
        return bytes(b), f"{name} at {off} = {value}"
    if mutation == "zero":
        if data[:4] == b"RIFF":
            i = data.find(b"data")
            return bytes(b[:i]) + b"data" + bytes(4), "WAV data chunk emptied"
        if suffix in (".mp4", ".mov"):
            boxes = [(o, k) for o, k in _mp4_boxes(data) if k in (b"mdat", b"stsz", b"stts", b"stco")]
            if boxes:
                off, kind = rng.choice(boxes)
                if kind == b"mdat":
                    size = struct.unpack(">I", data[off:off + 4])[0]
                    end = off + size if size >= 8 else len(data)
                    return data[:off] + struct.pack(">I", 8) + b"mdat" + data[end:], "mdat emptied"
                b[off + 12:off + 16] = bytes(4)          # entry count after version/flags
                return bytes(b), f"{kind.decode()} entry count 0"
        keep = rng.randrange(8, 64)
        return bytes(b[:keep]), f"only the first {keep} bytes (no stream data)"
    # splice: random bytes inserted, or a region repeated
    i = rng.randrange(len(b))
    if rng.random() < 0.5:
        junk = bytes(rng.randrange(256) for _ in range(rng.choice((1, 7, 100, 4096))))
        return bytes(b[:i]) + junk + bytes(b[i:]), f"{len(junk)} random bytes inserted at {i}"
    j = min(len(b), i + rng.randrange(1, 8192))
    return bytes(b[:j]) + bytes(b[i:j]) + bytes(b[j:]), f"bytes {i}-{j} repeated"


def _run(case: Case, cmd: list[str], env: dict, timeout: float, preexec=None) -> str:
    """Run `cmd` (killed with its process group after `timeout`); its exit code (None: killed), seconds and the tail
    of its stderr go into `case`; returns the whole stderr."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                            start_new_session=True, preexec_fn=preexec)
    try:
        _, err = proc.communicate(timeout=timeout)
        case.exit_code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        case.exit_code = None
    case.seconds = round(time.monotonic() - t0, 2)
    case.stderr_tail = "\n".join((err or "").strip().splitlines()[-3:])[-600:]
    return err or ""


# ----------------------------------------------------------------------------- hostile inputs
def _copy_avatar(store: Path, name: str) -> Path:
    d = store / name
    if not d.exists():
        shutil.copytree(store / "base", d)
    return d


def hostile_cases(seeds: dict[str, list[Path]], work: Path) -> list[tuple[Case, list[str], tuple[int, ...], list[Path]]]:
    """(case, CLI arguments, the exit codes it may end with, files that must be unchanged after it)."""
    d, store = work / "hostile", work / "home" / "avatars"
    d.mkdir(exist_ok=True)
    speech = seeds["render"][0]
    for name in ("fifo.json", "fifo.jsonl", "fifo.yaml", "fifo.wav"):
        if not (d / name).exists():
            os.mkfifo(d / name)
    (d / "bomb.yaml").write_text(alias_bomb("render:\n  crf: *i\n"))
    shipped = (REPO / "configs" / "delivery" / "web-h264.yaml").read_text()
    (d / "bomb-profile.yaml").write_text(alias_bomb(shipped.replace("container: mp4", "container: *i", 1)))
    (d / "deep.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n" +
                                  json.dumps({"avatar": "base", "audio": str(speech), "output": "x.mp4",
                                              "emotion": "x" * 5_000_000}) + "\n")
    (d / "jobs.jsonl").write_text(json.dumps({"avatar": "base", "audio": str(speech), "output": str(d / "j.mp4")})
                                  + "\n")
    bomb = reference_bomb(60, 2)
    pkl = _copy_avatar(store, "refbomb") / "avatar.pkl"
    from ditto_fast.avatar.format import encode_pkl, read_pkl

    record = read_pkl("base", store / "base")
    record["source"]["notes"] = bomb                 # a record that is valid but for the bomb, sealed as ours
    pkl.write_bytes(encode_pkl(record))
    fifo_pkl = _copy_avatar(store, "fifopkl") / "avatar.pkl"
    if not fifo_pkl.is_fifo():
        fifo_pkl.unlink()
        os.mkfifo(fifo_pkl)
    import numpy as np

    f_s = np.load(_copy_avatar(store, "nanfeat") / "f_s.npy", mmap_mode="r+")
    f_s[len(f_s) // 2] = np.nan                 # a frame in the middle, as bytes overwritten on disk would be
    f_s.flush()
    del f_s
    out = str(d / "out.mp4")
    render = ["render", "--audio", str(speech), "-o", out, "--device", "cpu", "--quiet"]
    base = ["--avatar", "base"]
    cases = [
        ("controls-fifo", [*render, *base, "--controls", str(d / "fifo.json")], (3,)),
        ("controls-zero", [*render, *base, "--controls", "/dev/zero"], (3,)),
        ("emotion-fifo", [*render, *base, "--emotion", str(d / "fifo.json")], (3,)),
        ("config-fifo", ["config", "--config", str(d / "fifo.yaml")], (3,)),
        ("config-zero", ["config", "--config", "/dev/zero"], (3,)),
        ("config-bomb", ["config", "--config", str(d / "bomb.yaml")], (2,)),
        ("profile-bomb", [*render, *base, "--delivery", str(d / "bomb-profile.yaml")], (2,)),
        ("audio-fifo", ["render", "--audio", str(d / "fifo.wav"), "-o", out, *base, "--device", "cpu"], (3,)),
        ("audio-zero", ["render", "--audio", "/dev/zero", "-o", out, *base, "--device", "cpu"], (3,)),
        ("jobs-fifo", ["batch", str(d / "fifo.jsonl"), "--device", "cpu", "--quiet"], (3,)),
        ("jobs-zero", ["batch", "/dev/zero", "--device", "cpu", "--quiet"], (3,)),
        ("jobs-deep", ["batch", str(d / "deep.jsonl"), "--device", "cpu", "--quiet"], (7,)),
        ("report-is-jobs", ["batch", str(d / "jobs.jsonl"), "--report", str(d / "jobs.jsonl"), "--device", "cpu"],
         (2,)),
        ("report-is-audio", ["batch", str(d / "jobs.jsonl"), "--report", str(speech), "--device", "cpu"], (2,)),
        ("timings-is-audio", [*render, *base, "--timings", str(speech)], (2,)),
        ("timings-is-output", [*render, *base, "--timings", out], (2,)),
        ("pickle-refbomb", [*render, "--avatar", "refbomb"], (5,)),
        ("pickle-refbomb-list", ["avatars"], (0,)),
        ("pickle-fifo", [*render, "--avatar", "fifopkl"], (5,)),
        ("features-nan", [*render, "--avatar", "nanfeat", "--steps", "2"], (5,)),
    ]
    watched = [speech, d / "jobs.jsonl", *(seeds["render"][1:])]
    return [(Case("hostile", i, name, "hostile", " ".join(args)[:300]), args, codes, watched)
            for i, (name, args, codes) in enumerate(cases)]


def run_hostile(case: Case, args: list[str], codes: tuple[int, ...], watched: list[Path], work: Path, env: dict,
                timeout: float) -> Case:
    """Run one hostile case; it must end in time with one of `codes`, leave every watched file as it was, and put
    nothing at the render's output."""
    before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in watched}
    out = work / "hostile" / "out.mp4"
    err = _run(case, [sys.executable, "-m", "ditto_fast.cli", *args], env, timeout,
               lambda: resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT)))
    problems = []
    if case.exit_code is None:
        case.verdict, problems = "hang", [f"no exit within {timeout:g} s"]
    elif case.exit_code not in codes:
        case.verdict, problems = "bad_exit", [f"exit {case.exit_code}, expected {codes}"]
    if len((err or "").strip().splitlines()) > 1 and case.exit_code not in (0, 7):
        problems.append("more than one line on stderr")
    changed = [p.name for p in watched if (p.stat().st_size, p.stat().st_mtime_ns) != before[p]]
    if changed:
        problems.append(f"inputs changed: {changed}")
    if out.exists():
        problems.append("something at the output path")
        out.unlink()
    case.verdict = case.verdict or ("leftover" if problems else "ok")
    case.problem = "; ".join(problems)
    print(f"hostile:{case.seed_file} exit {case.exit_code} {case.verdict} ({case.seconds:.0f} s)", flush=True)
    return case


# ----------------------------------------------------------------------------- runs
def _partials(folder: Path, stem: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{stem}") and
                  (".part" in p.name or ".probe" in p.name))


def run_case(case: Case, path: Path, work: Path, env: dict, timeout: float) -> Case:
    """Run one mutated input through the CLI and judge what it did."""
    out_dir, store = work / "out", work / "home" / "avatars"
    cli = [sys.executable, "-m", "ditto_fast.cli"]
    if case.command == "render":
        out = out_dir / f"case{case.index}.mp4"
        cmd = [*cli, "render", "--avatar", "base", "--audio", str(path), "-o", str(out), "--device", "cpu", "--quiet"]
    else:
        out = store / f"fz{case.index}"
        cmd = [*cli, "register", str(path), "--name", f"fz{case.index}", "--device", "cpu", "--quiet"]
    _run(case, cmd, env, timeout)
    problems = []
    if case.exit_code is None:
        case.verdict, problems = "hang", [f"no exit within {timeout:g} s"]
    elif case.exit_code not in OK_CODES:
        case.verdict, problems = "bad_exit", [f"exit {case.exit_code}"]
    if case.command == "render":
        left = _partials(out_dir, out.name)
        if case.exit_code != 0 and out.exists():
            problems.append(f"{out.name} exists after exit {case.exit_code}")
        if left and case.exit_code is not None:
            problems.append(f"partial files {left}")
    else:
        mine = f"fz{case.index}-"           # this run's temporaries only (others may be running beside it)
        tmp = sorted(p.name for p in store.iterdir() if p.name.startswith(".tmp-") and mine in p.name) \
            if store.is_dir() else []
        if tmp and case.exit_code is not None:
            problems.append(f"store temporaries {tmp}")
        if case.exit_code not in (0, None) and out.exists():
            problems.append(f"avatar {out.name} exists after exit {case.exit_code}")
        if case.exit_code == 0:
            from ditto_fast.avatar import load_avatar
            from ditto_fast.core.errors import DittoError

            try:
                load_avatar(out, verify="full")
            except DittoError as e:
                problems.append(f"registered avatar does not load: {e}")
    if problems and not case.verdict:
        case.verdict = "leftover"
    case.verdict = case.verdict or "ok"
    case.problem = "; ".join(problems)
    print(f"{case.command}:{case.index} exit {case.exit_code} {case.verdict} ({case.seconds:.0f} s, {case.mutation})",
          flush=True)
    if case.command == "register" and out.exists():
        shutil.rmtree(out, ignore_errors=True)                 # keep the store small
    if case.command == "render" and case.exit_code == 0:
        out.unlink(missing_ok=True)
    return case


def build_cases(seeds: dict[str, list[Path]], n: int, seed: int, work: Path, only: str | None) -> list[tuple[Case, Path]]:
    """The mutated inputs (deterministic in `seed`), written under work/cases."""
    d = work / "cases"
    d.mkdir(exist_ok=True)
    cases = []
    for command in ("render", "register"):
        for i in range(n):
            if only and only != f"{command}:{i}":
                continue
            rng = random.Random(f"{seed}:{command}:{i}")
            src = rng.choice(seeds[command])
            mutation = rng.choice(MUTATIONS)
            data, detail = mutate(src.read_bytes(), src.suffix, mutation, rng)
            path = d / f"{command}_{i}{src.suffix}"
            path.write_bytes(data)
            cases.append((Case(command, i, src.name, mutation, detail), path))
    return cases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="cases per command (render, register)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds a run may take")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once")
    ap.add_argument("--json", type=Path, default=Path("fuzz_report.json"))
    ap.add_argument("--keep", type=Path, default=None, help="copy failing inputs here")
    ap.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one, removed)")
    ap.add_argument("--only", default=None, help="one case, e.g. render:17")
    args = ap.parse_args(argv)

    from ditto_fast.checkpoints.random_weights import write_random

    work = args.work or Path(tempfile.mkdtemp(prefix="ditto-fuzz-"))
    try:
        for sub in ("out", "home"):
            (work / sub).mkdir(parents=True, exist_ok=True)
        ckpt = work / "ckpt"
        if not (ckpt / "ditto_pytorch").is_dir():
            write_random(ckpt, tiny=True, seed=0)
        env = dict(os.environ, DITTO_FAST_HOME=str(work / "home"), DITTO_FAST_CHECKPOINTS=str(ckpt),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                   OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        seeds = make_seeds(work)
        if not (work / "home" / "avatars" / "base").is_dir():
            subprocess.run([sys.executable, "-m", "ditto_fast.cli", "register", str(seeds["register"][0]), "--name",
                            "base", "--device", "cpu", "--quiet"], env=env, check=True, cwd=REPO,
                           stdout=subprocess.DEVNULL)
        cases = build_cases(seeds, args.n, args.seed, work, args.only)
        hostile = [h for h in hostile_cases(seeds, work) if not args.only or args.only == f"hostile:{h[0].seed_file}"]
        t0 = time.monotonic()
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            done = list(pool.map(lambda cp: run_case(cp[0], cp[1], work, env, args.timeout), cases))
        done += [run_hostile(*h, work, env, min(args.timeout, 120.0)) for h in hostile]
        wall = time.monotonic() - t0
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for case, path in cases:
                if case.verdict != "ok":
                    shutil.copy(path, args.keep / path.name)     # hostile cases are rebuilt by the script itself
        summary = {}
        for command in ("render", "register", "hostile"):
            mine = [c for c in done if c.command == command]
            summary[command] = {
                "runs": len(mine),
                "exit_codes": {str(k): sum(c.exit_code == k for c in mine)
                               for k in sorted({c.exit_code for c in mine}, key=lambda v: (v is None, v or 0))},
                **{v: sum(c.verdict == v for c in mine) for v in ("ok", "bad_exit", "hang", "leftover")},
            }
        report = {"seed": args.seed, "n": args.n, "timeout_s": args.timeout, "wall_seconds": round(wall, 1),
                  "summary": summary, "cases": [asdict(c) for c in done]}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"{'command':<10}{'runs':>6}{'ok':>6}{'exit 1/other':>14}{'hang':>6}{'partial':>9}   exit codes")
        for command, s in summary.items():
            print(f"{command:<10}{s['runs']:>6}{s['ok']:>6}{s['bad_exit']:>14}{s['hang']:>6}{s['leftover']:>9}   "
                  f"{s['exit_codes']}")
        for c in done:
            if c.verdict != "ok":
                print(f"  {c.command}:{c.index} {c.verdict}: {c.problem} [{c.seed_file}, {c.mutation}: {c.detail}] "
                      f"{c.stderr_tail.splitlines()[-1] if c.stderr_tail else ''}")
        print(f"{wall:.0f} s; report in {args.json}")
        return 0 if all(c.verdict == "ok" for c in done) else 1
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
