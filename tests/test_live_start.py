"""`ditto-fast live`'s checks before anything loads (live/start.py's run_live): what the stream and --stats would
write, the source's own file, folders, destinations that cannot be reached. Each case runs the command in this
process with the engine replaced by one that fails the test if it is ever made: a refusal must come first."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import imageio_ffmpeg
import pytest

FFMPEG = imageio_ffmpeg.get_ffmpeg_exe()


@pytest.fixture()
def no_engine(monkeypatch):
    """Making the engine (loading the networks) fails the test: the refusals come before it."""
    import ditto_fast.engine.renderer as renderer

    class NoRenderer:
        def __init__(self, *args, **kwargs):
            raise AssertionError("the networks were loaded before the refusal")

    monkeypatch.setattr(renderer, "Renderer", NoRenderer)


def tone_ts(path: Path, seconds: float = 1.0) -> Path:
    """An MPEG-TS file holding a tone (speech a stream can read, and a name a stream can write)."""
    subprocess.run([FFMPEG, "-hide_banner", "-nostdin", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
                    f"sine=f=220:d={seconds}", "-c:a", "mp2", "-f", "mpegts", str(path)], check=True)
    return path


def live(run_cli, tmp_path, *args):
    r = run_cli(["live", "--avatar", "small", *map(str, args)], {"DITTO_FAST_HOME": str(tmp_path / "home")})
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ditto-fast: error: "), r.stderr
    return r.returncode, lines[0]


# ----------------------------------------------------------------------------- 8: the stream's own source; --force
def test_an_out_that_is_its_own_source_is_refused(run_cli, tmp_path, no_engine):
    speech = tone_ts(tmp_path / "speech.ts")
    before = speech.read_bytes()
    (tmp_path / "link.ts").symlink_to(speech)
    os.link(speech, tmp_path / "hard.ts")
    for out in (speech, tmp_path / "link.ts", tmp_path / "hard.ts", tmp_path / "sub" / ".." / "speech.ts"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        code, line = live(run_cli, tmp_path, "--audio-in", speech, "--out", out, "--force")
        assert code == 2 and "its own source" in line and str(out) in line, line
    # an HLS playlist's segments are written beside it: a segment is no source either
    segment = tone_ts(tmp_path / "show_00002.ts")
    code, line = live(run_cli, tmp_path, "--audio-in", segment, "--out", tmp_path / "show.m3u8", "--force")
    assert code == 2 and "its own source" in line, line
    assert speech.read_bytes() == before


def test_an_existing_out_needs_force(run_cli, tmp_path, no_engine):
    speech = tone_ts(tmp_path / "speech.ts")
    done = tmp_path / "done.ts"
    done.write_bytes(b"yesterday's stream")
    code, line = live(run_cli, tmp_path, "--audio-in", speech, "--out", done)
    assert code == 2 and "done.ts: exists" in line and "--force" in line, line
    (tmp_path / "hls").mkdir()
    (tmp_path / "hls" / "show_00000.ts").write_bytes(b"a segment of yesterday's playlist")
    code, line = live(run_cli, tmp_path, "--audio-in", speech, "--out", tmp_path / "hls" / "show.m3u8")
    assert code == 2 and "show_00000.ts: exists" in line and "--force" in line, line
    assert done.read_bytes() == b"yesterday's stream"
    # with --force the checks pass on to the engine (here one that fails as soon as it is made)
    r = run_cli(["live", "--avatar", "small", "--audio-in", str(speech), "--out", str(done), "--force"],
                {"DITTO_FAST_HOME": str(tmp_path / "home")})
    assert "the networks were loaded" in r.stderr, r.stderr


def test_help_says_what_force_does(run_cli):
    r = run_cli(["live", "--help"])
    assert "--force" in r.stdout and "Replace an --out file" in r.stdout


# ----------------------------------------------------------------------------- 9: --stats, before the stream
def test_stats_is_checked_before_anything_loads(run_cli, tmp_path, no_engine):
    speech = tone_ts(tmp_path / "speech.ts")
    out = tmp_path / "out.ts"
    cases = [
        (out, 2, "the stream (--out"),                                      # the stream's own file
        (speech, 2, "would overwrite an input"),                            # the source
        (tmp_path / "show_00001.ts", 2, "the stream (--out"),               # a segment of the HLS below
        (tmp_path, 3, "is a directory"),                                    # a folder
        (tmp_path / "gone" / "s.json", 3, "does not exist"),                # a folder that is not there
    ]
    for stats, code, says in cases:
        dest = tmp_path / "show.m3u8" if stats.name.startswith("show_") else out
        got, line = live(run_cli, tmp_path, "--audio-in", speech, "--out", dest, "--stats", stats)
        assert (got, says in line) == (code, True), (stats, line)
    assert not out.exists()


def test_stats_in_a_folder_that_cannot_be_written(tmp_path):
    """As a process that file modes bind (as root, CI's user: without root's power to write anywhere); refused
    before anything loads."""
    import sys

    from support import without_root_powers

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    r = subprocess.run([sys.executable, "-m", "ditto_fast.cli", "live", "--avatar", "small", "--audio-in",
                        str(tone_ts(tmp_path / "speech.ts")), "--out", str(tmp_path / "out.ts"), "--stats",
                        str(locked / "s.json")], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "DITTO_FAST_HOME": str(tmp_path / "home")},
                       preexec_fn=without_root_powers if os.geteuid() == 0 else None)
    if r.returncode == 99:
        pytest.skip("root here cannot drop CAP_DAC_OVERRIDE (no CAP_SETPCAP), so every folder is writable to it")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 3 and len(lines) == 1 and "cannot write" in lines[0], r.stderr


# ----------------------------------------------------------------------------- issue 66: one set of file rules
def test_an_existing_stats_file_needs_force_as_out_does(run_cli, tmp_path, no_engine):
    """--stats onto a file that is there is refused as an --out there is (exit 2, the file named, --force the fix);
    before, it was replaced without a word at the end of the stream."""
    speech = tone_ts(tmp_path / "speech.ts")
    stats = tmp_path / "yesterday.json"
    stats.write_text('{"yesterday": true}\n')
    code, line = live(run_cli, tmp_path, "--audio-in", speech, "--out", tmp_path / "out.ts", "--stats", stats)
    assert code == 2 and f"--stats {stats}: exists" in line and "give --force" in line, line
    assert stats.read_text() == '{"yesterday": true}\n'
    r = run_cli(["live", "--avatar", "small", "--audio-in", str(speech), "--out", str(tmp_path / "out.ts"),
                 "--stats", str(stats), "--force"], {"DITTO_FAST_HOME": str(tmp_path / "home")})
    assert "the networks were loaded" in r.stderr, r.stderr


def test_stats_onto_another_streams_playlist_or_segment_is_refused_even_with_force(run_cli, tmp_path, no_engine):
    """Another stream's recording (its playlist, a segment, a .ts) is never overwritten by the figures' JSON."""
    speech = tone_ts(tmp_path / "speech.ts")
    (tmp_path / "other.m3u8").write_text("#EXTM3U\n#EXT-X-ENDLIST\n")
    (tmp_path / "other_00003.ts").write_bytes(b"a segment of another stream")
    for stats in (tmp_path / "other.m3u8", tmp_path / "other_00003.ts", tmp_path / "new.ts"):
        before = stats.read_bytes() if stats.exists() else None
        code, line = live(run_cli, tmp_path, "--audio-in", speech, "--out", tmp_path / "out.ts", "--stats", stats,
                          "--force")
        assert code == 2 and f"--stats {stats}: the figures are JSON" in line and ".json" in line, line
        assert (stats.read_bytes() if stats.exists() else None) == before


# ----------------------------------------------------------------------------- 11: a URL that answers 404
def test_a_source_url_that_answers_404_is_exit_3_before_anything_loads(run_cli, tmp_path, no_engine):
    import http.server
    import threading

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404, "Not Found")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/news.mp3"
        code, line = live(run_cli, tmp_path, "--audio-in", url, "--out", tmp_path / "out.ts")
    finally:
        server.shutdown()
        server.server_close()
    assert code == 3 and f"{url}: the server answers 404 Not Found" in line, line
    assert not (tmp_path / "out.ts").exists()


# ----------------------------------------------------------------------------- 13: the exit codes the table gives
def test_destinations_that_cannot_be_written_or_reached_are_exit_3_before_anything_loads(run_cli, tmp_path,
                                                                                         no_engine):
    from support import free_port

    speech = tone_ts(tmp_path / "speech.ts")
    port = free_port()
    cases = [
        (tmp_path / "gone" / "out.ts", "directory"),                                 # the table: 3, not 2
        (f"rtmp://127.0.0.1:{port}/live/key", f"cannot connect to 127.0.0.1:{port}"),  # nobody takes RTMP there
        ("srt://no-such-host.invalid:9000", "the host no-such-host.invalid is not known"),
        ("udp://no-such-host.invalid:9000", "the host no-such-host.invalid is not known"),
    ]
    for out, says in cases:
        code, line = live(run_cli, tmp_path, "--audio-in", speech, "--out", out)
        assert code == 3 and says in line and line.startswith(f"ditto-fast: error: {out}"), line


def test_a_reachable_rtmp_server_passes_on_to_the_engine(run_cli, tmp_path, no_engine):
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        r = run_cli(["live", "--avatar", "small", "--audio-in", str(tone_ts(tmp_path / "speech.ts")), "--out",
                     f"rtmp://127.0.0.1:{port}/live/key"], {"DITTO_FAST_HOME": str(tmp_path / "home")})
    assert "the networks were loaded" in r.stderr, r.stderr


def test_the_exit_code_table_says_what_live_does_on_an_interrupt():
    """The table's 130/143 row (docs/commands.md's, and the README's short one) and live's own section agree with
    the code: once it streams, Ctrl-C and SIGTERM end the stream cleanly (exit 0, the file complete;
    test_live_session.py sends both); before, 130/143."""
    from conftest import REPO

    short = (REPO / "README.md").read_text()
    row = next(ln for ln in short.splitlines() if ln.startswith("| 130 / 143 |"))
    assert "`live`" in row and "exit 0" in row, row
    text = (REPO / "docs" / "commands.md").read_text()
    row = next(ln for ln in text.splitlines() if ln.startswith("| 130 / 143 |"))
    assert "`live`" in row and "exit 0" in row and "complete" in row, row
    table = text[text.index("## Exit codes"):]
    table = table[:table.index("\n## ")]
    three = next(ln for ln in table.splitlines() if ln.startswith("| 3 |"))
    assert "`live`" in three and "RTMP" in three, three


def test_live_on_a_compiled_engine_is_refused_before_the_networks_load(run_cli, tmp_path, no_engine):
    """torch.compile's graphs are kept per thread, and the session's own warp + decode would compile minutes into the
    stream: refused in words, naming the launch that works."""
    speech = tone_ts(tmp_path / "speech.ts")
    code, line = live(run_cli, tmp_path, "--audio-in", speech, "--out", tmp_path / "out.ts", "--launch", "compile")
    assert code == 2 and "--launch graphs" in line and not (tmp_path / "out.ts").exists(), line
