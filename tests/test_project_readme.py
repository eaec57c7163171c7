"""Every example in the README and in docs/*.md works as written: its shell blocks and the commands of its command
tables run (tiny checkpoints, a synthetic anchor, the files a user would bring), a `ditto-fast serve ... &` line
starting the server the next blocks of that page talk to; its Python blocks run; its JSON blocks are a valid
control file and valid job lines; the commands' synopsis is the one made from their declarations. A block that
cannot run here says so just before it, `<!-- not run: WHY -->`, and is counted."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO

README = REPO / "README.md"
PAGES = (README, *sorted((REPO / "docs").glob("*.md")))
RUN = {"bash": "shell", "sh": "shell", "python": "python", "py": "python", "json": "json"}
NOT_RUN = re.compile(r"<!-- not run: (.+?) -->")
FILE = re.compile(r"<!-- file: (\S+) -->")         # the block is that file, written where the page's examples run
SERVE_LINE = re.compile(r"^(ditto-fast serve [^#]*?)\s*&\s*(#.*)?$")     # started for the page's later blocks
SERVE_PORT = "8750"


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    text: str
    not_run: str | None        # the reason given, when it is not run
    file: str | None = None    # the file it is, when it says so

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The page's fenced code blocks, each with the `not run` reason written just before it, if any."""
    lines, found, i = page.read_text().splitlines(), [], 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        reason, file = NOT_RUN.search(before), FILE.search(before)
        found.append(Block(page, i + 1, m.group(1), "\n".join(lines[i + 1:end]) + "\n",
                           reason.group(1).strip() if reason else None, file.group(1) if file else None))
        i = end + 1
    return found


def table_commands(page: Path) -> list[Block]:
    """The commands of the page's command tables (a table whose last column is `command`): each a one-line shell
    block, in the page's order."""
    found, in_table = [], False
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("|") and line.rstrip().rstrip("|").rstrip().endswith("| command"):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table:
            m = re.search(r"\| `(ditto-fast [^`]+)`[^|]*\|\s*$", line)
            if m:
                found.append(Block(page, n, "sh", m.group(1) + "\n", None))
    return found


def runnable(page: Path) -> list[Block]:
    """What the page runs, in its order: its shell and Python blocks (not marked `not run`), the files it writes
    (a block marked `<!-- file: NAME -->`) and its tables' commands."""
    run = [b for b in blocks(page) if b.not_run is None and (RUN.get(b.lang) in ("shell", "python") or b.file)]
    return sorted(run + table_commands(page), key=lambda b: b.line)


def test_every_block_runs_or_says_why_not():
    """Each fenced block is run (shell, Python), checked (JSON, the synopsis) or marked `<!-- not run: WHY -->`
    with its reason; the count of those not run is said."""
    unmarked, not_run = [], []
    for page in PAGES:
        for b in blocks(page):
            if b.not_run is not None:
                assert len(b.not_run) > 10, f"{b.where}: say why the block is not run"
                not_run.append(f"{b.where}: {b.not_run}")
            elif b.lang not in RUN and "ditto-fast register SOURCE" not in b.text:
                unmarked.append(f"{b.where} ({b.lang or 'untagged'})")
    assert not unmarked, f"blocks neither run nor marked `<!-- not run: WHY -->`: {unmarked}"
    print(f"{len(not_run)} blocks not run:", *not_run, sep="\n  ")
    assert len(not_run) <= 8, not_run          # a few, each for a reason: not a way out of running examples


def test_the_synopsis_is_made_from_the_declarations():
    """docs/commands.md's synopsis is what scripts/docs_synopsis.py makes from the commands (so every option
    `--help` lists, render's caption options included, is in it)."""
    sys.path.insert(0, str(REPO / "scripts"))
    import docs_synopsis

    assert docs_synopsis.committed() == docs_synopsis.block(), \
        "docs/commands.md: the synopsis is out of date; run python scripts/docs_synopsis.py --write"
    text = docs_synopsis.synopsis()
    for flag in ("--captions", "--script", "--captions-out", "--burn-in", "--emotion-strength", "--launch",
                 "--allow-host", "--overlap", "--stop-at-end"):
        assert flag in text, flag


def test_the_json_examples_are_control_files_and_job_lines(tmp_path):
    from ditto_fast.engine.request import RenderRequest
    from ditto_fast.motion.controls import parse_controls

    checked = 0
    for page in PAGES:
        for b in blocks(page):
            if b.lang != "json" or b.not_run is not None:
                continue
            rows = [json.loads(ln) for ln in b.text.strip().splitlines()] if b.text.lstrip().startswith(
                '{"avatar"') else None
            if rows:
                for i, row in enumerate(rows):
                    RenderRequest.from_json(row, tmp_path, f"{b.where} job line {i + 1}")
            else:
                parse_controls(json.loads(b.text), 120, b.where)
            checked += 1
    assert checked >= 2


def test_every_route_of_the_api_is_in_the_one_route_table():
    """docs/serve.md's route table names every route the app serves, and nothing else."""
    from ditto_fast.serve.app import make_app

    text = (REPO / "docs" / "serve.md").read_text()
    table = text[text.index("## Routes"):]
    table = table[:table.index("\n## ")]
    rows = set()
    for line in table.splitlines():
        m = re.match(r"\| (GET|POST|DELETE|WebSocket) \| (.+?) \|", line)
        if m:
            for path in re.findall(r"`([^`]+)`", m.group(2)):
                rows.add((m.group(1), re.sub(r"\?.*", "", path)))

    from types import SimpleNamespace

    from ditto_fast.serve.page.api import PageFiles

    nowhere = Path("/nonexistent")
    app = make_app(SimpleNamespace(get=None), SimpleNamespace(roots=[nowhere], decoded=None), None, None,
                   live=SimpleNamespace(),
                   files=PageFiles([nowhere], nowhere, nowhere))
    served = set()
    for route in app.routes:
        path = re.sub(r"\{(\w+)\}", lambda m: {"job_id": "ID", "sid": "ID", "vid": "VIEWER", "name": "NAME"}[m.group(1)],
                      route.path)
        if path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            continue
        for method in getattr(route, "methods", None) or {"WebSocket"}:
            if method != "HEAD":
                served.add((method, path))
    assert served - rows == set(), f"routes served but not in docs/serve.md's table: {sorted(served - rows)}"
    assert rows - served == set(), f"routes in docs/serve.md's table the app does not serve: {sorted(rows - served)}"


# ---- the examples, run ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def inputs(tmp_path_factory, speech_wav):
    """What a user brings: an anchor video, speech (1.5 s: long enough for a leveling delivery profile), a script
    and captions for it, a folder of speech."""
    import soundfile as sf
    from imageio_ffmpeg import get_ffmpeg_exe as ffmpeg
    from synthetic import Motion, write_anchor_video

    d = tmp_path_factory.mktemp("readme_inputs")
    write_anchor_video(d / "anchor.mp4", 10, size=(960, 540), face_px=120, motion=Motion(center=(480.0, 470.0)),
                       bt709=True)
    audio, sr = sf.read(speech_wav, dtype="float32")
    sf.write(d / "a.wav", audio[int(1.0 * sr):int(2.5 * sr)], sr)
    for name in ("b.wav", "news.wav", "in/take1.wav"):
        (d / name).parent.mkdir(exist_ok=True)
        shutil.copy(d / "a.wav", d / name)
    (d / "wav").mkdir()
    for name in ("0100_headlines.wav", "0130_weather.wav"):
        shutil.copy(d / "a.wav", d / "wav" / name)
    subprocess.run([ffmpeg(), "-v", "error", "-i", str(d / "a.wav"), str(d / "wav" / "0200_sport.mp3")], check=True)
    (d / "sport.json").write_text('{"default": {"pose_scale": 1.2}, "blinks": [5]}\n')
    (d / "a.txt").write_text("Good evening.\n")
    (d / "story.srt").write_text("1\n00:00:00,000 --> 00:00:01,400\nGood evening.\n")
    return d


@pytest.fixture(scope="module")
def ruby_home(tmp_path_factory, inputs, tiny_checkpoints):
    """A store holding the avatars `ruby` and `sam` the pages render (registered once from the anchor)."""
    home = tmp_path_factory.mktemp("readme_home")
    for name in ("ruby", "sam"):
        subprocess.run([sys.executable, "-m", "ditto_fast.cli", "register", str(inputs / "anchor.mp4"), "--name", name,
                        "--checkpoints", str(tiny_checkpoints), "--quiet"],
                       env=dict(os.environ, DITTO_FAST_HOME=str(home)), check=True)
    return home


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


class Server:
    """A `ditto-fast serve ... &` line of a page, started for the blocks after it."""

    def __init__(self, line: str, cwd: Path, env: dict, port: str):
        self.log = cwd / "serve.log"
        command = SERVE_LINE.match(line).group(1) + f" --port {port}"
        self.proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                                     stderr=self.log.open("w"), start_new_session=True)
        deadline = time.monotonic() + 600
        while '"listening"' not in self.log.read_text():
            assert self.proc.poll() is None, f"{command}: exit {self.proc.returncode}: {self.log.read_text()[-800:]}"
            assert time.monotonic() < deadline, f"{command}: not listening after 600 s"
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise
        assert code == 0, f"serve ended with exit {code}: {self.log.read_text()[-800:]}"


def run_page(page: Path, workdir: Path, env: dict) -> dict[str, str]:
    """Run the page's examples in order in `workdir`; returns each Python block's stdout by its place."""
    port, server, printed = free_port(), None, {}
    try:
        for b in runnable(page):
            text = b.text.replace(SERVE_PORT, port)
            if b.file:
                (workdir / b.file).write_text(b.text)
                continue
            if RUN[b.lang] == "python":
                r = subprocess.run([sys.executable, "-c", text], cwd=workdir, env=env, capture_output=True, text=True,
                                   timeout=900)
                assert r.returncode == 0, f"{b.where}: {r.stderr[-1500:]}"
                printed[b.where] = r.stdout
                continue
            script: list[str] = []
            for line in [*text.splitlines(), None]:
                if line is None or SERVE_LINE.match(line):       # what came before it runs first
                    r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", "\n".join(script)], cwd=workdir,
                                       env=env, capture_output=True, text=True, timeout=900)
                    assert r.returncode == 0, f"{b.where}: exit {r.returncode}: {r.stderr[-1500:]}"
                    script = []
                if line is not None and SERVE_LINE.match(line):
                    assert server is None, f"{b.where}: a second server on one page"
                    server = Server(line, workdir, env, port)
                elif line is not None:
                    assert not re.search(r"(?<!&)&\s*(#.*)?$", line), f"{b.where}: only `ditto-fast serve` runs in the background"
                    script.append(line)
    finally:
        if server is not None:
            server.stop()
    return printed


def page_env(workdir: Path) -> dict:
    return dict(os.environ, DITTO_FAST_HOME=str(workdir / "home"), PYTHONPATH=str(REPO),
                PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


def workdir_for(tmp_path: Path, inputs: Path, tiny_checkpoints: Path, ruby_home: Path | None) -> Path:
    """A folder with what a user brings, the checkpoints as `ckpt` and `./checkpoints` and, unless the page makes
    its own, the avatar `ruby` in the store."""
    d = tmp_path / "work"
    shutil.copytree(inputs, d)
    if ruby_home is not None:
        shutil.copytree(ruby_home, d / "home")
        for name in ("ckpt", "checkpoints"):
            (d / name).symlink_to(tiny_checkpoints)
    return d


@pytest.mark.slow
def test_the_readme_runs_as_written(tmp_path, inputs, tiny_checkpoints):
    """From nothing: random checkpoints, the avatar registered, a render, a batch, a server with a job and a live
    session fed over the WebSocket, a live rehearsal. The WebSocket client heard back what it sent: the speech
    shown is the WAV's length."""
    import soundfile as sf

    d = workdir_for(tmp_path, inputs, tiny_checkpoints, None)
    printed = run_page(README, d, page_env(d))
    for out in ("news.mp4", "mp4/a.mp4", "mp4/b.mp4", "report.json", "rehearsal.ts", "rehearsal.json",
                "news/out/live.ts"):
        assert (d / out).stat().st_size > 0, out
    (said,) = [v for v in printed.values() if v.startswith("shown:")]
    shown = float(re.search(r"shown: ([\d.]+) s", said).group(1))
    assert shown == pytest.approx(sf.info(str(d / "a.wav")).duration, abs=0.05), said


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(p.name for p in PAGES[1:] if runnable(p)))
def test_the_pages_run_as_written(name, tmp_path, inputs, tiny_checkpoints, ruby_home):
    d = workdir_for(tmp_path, inputs, tiny_checkpoints, ruby_home)
    run_page(REPO / "docs" / name, d, page_env(d))


def test_the_pages_that_run_are_these():
    """The pages whose examples run (a page left out would not be tried)."""
    assert {p.name for p in PAGES[1:] if runnable(p)} >= {"batch.md", "delivery.md", "emotion.md", "live.md",
                                                         "serve.md"}


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def test_every_link_between_the_pages_lands():
    """Each relative link of the README and docs/*.md names a file that exists and, with `#anchor`, a heading of
    it (so a section moved keeps its links working)."""
    broken = []
    for page in PAGES:
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md":
                slugs = {_slug(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(), re.M)}
                if anchor not in slugs:
                    broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken
