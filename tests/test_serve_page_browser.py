"""The newsroom page in a real browser: Debian's headless Chromium (/usr/bin/chromium) driven by Playwright for Python
(no browser download: Playwright launches that executable) against a real `ditto-fast serve` with a token. A
producer's whole path: enter the token, upload a WAV, pick the anchor and the delivery, submit as breaking, watch the
progress bar move, see the job done and its preview, download the file; and cancel another job. With
DITTO_FAST_SCREENSHOTS=DIR set (scripts/page_screenshots.py), the page's screenshots are saved there."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from conftest import SERVE_TOKEN
from support import speech_clip

pytestmark = pytest.mark.slow
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture()
def browser():
    """A headless Chromium (Debian's), driven by Playwright."""
    if not CHROMIUM.exists():
        pytest.skip(f"the browser tests need Debian's chromium at {CHROMIUM}: apt-get install -y chromium")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright (the test extra)")
    with sync_api.sync_playwright() as p:
        # --no-sandbox: Chromium's sandbox refuses to run as root, as CI's containers do
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        yield b
        b.close()


def _row(job_id: str) -> str:
    return f'#queue .job[data-job="{job_id}"]'


def _until(page, function: str, arg=None, timeout: float = 60) -> None:
    """Wait until the JavaScript `function` (called with `arg`) is true in the page (polled from here: the page's
    Content-Security-Policy forbids the string evaluation Playwright's wait_for_function uses)."""
    deadline = time.monotonic() + timeout
    while not page.evaluate(function, arg):
        assert time.monotonic() < deadline, f"still not true after {timeout} s: {function}"
        time.sleep(0.1)


def _sample(page, job_id: str) -> dict | None:
    """What the page shows of a job now: its state, progress bar value and stage text."""
    return page.evaluate("""(sel) => { const r = document.querySelector(sel); if (!r) return null;
        return {status: r.dataset.status, value: r.querySelector('progress').value,
                stage: r.querySelector('.stage').textContent}; }""", _row(job_id))


def test_a_producer_s_whole_path_in_a_browser(serving, browser, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(SERVE_TOKEN + "\n")
    server = serving("--token-file", str(token_file))
    server.token = SERVE_TOKEN
    booth = speech_clip(tmp_path.parent, "booth take 1.wav", 3.0)      # on the producer's machine, not the server's
    # a normal job that runs first, so that the page's breaking job and the one to cancel wait behind it
    normal = server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(speech_clip(tmp_path, "n.wav", 2.0)),
                                              "output": str(tmp_path / "n.mp4")})[1]["id"]
    context = browser.new_context(accept_downloads=True, viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    page.goto(f"http://127.0.0.1:{server.port}/")

    # the page asks for the token once, and shows nothing before it
    page.wait_for_selector("#token-panel:not([hidden])")
    assert page.is_hidden("#newsroom")
    page.fill("#token", "a-wrong-token-of-some-length")
    page.click("#token-form button")
    _until(page, "() => document.getElementById('token-error').textContent.includes('refused')")
    page.fill("#token", SERVE_TOKEN)
    page.click("#token-form button")
    page.wait_for_selector("#avatar option[value=anchor]", state="attached")
    page.wait_for_selector('#avatars .card[data-avatar="anchor"] img[src^="blob:"]', timeout=60_000)
    assert page.evaluate("document.querySelector('#avatars .card img').naturalWidth") > 0
    assert "web-h264" in page.inner_text("#profiles")

    # a file that is not audio is refused in one line, and not kept
    notes = tmp_path.parent / "notes.wav"
    notes.write_text("not a recording\n" * 50)
    page.set_input_files("#audio-file", str(notes))
    page.click("#submit")
    _until(page, "() => document.getElementById('form-status').textContent.includes('notes.wav:')")
    assert not list((tmp_path / "uploads").glob("*notes*"))
    assert server.call("GET", "/v1/jobs")[1]["jobs"][0]["id"] == normal          # nothing queued

    # upload, choose, submit as breaking
    page.set_input_files("#audio-file", str(booth))
    page.select_option("#avatar", "anchor")
    page.select_option("#delivery", "web-h264")
    page.check("#breaking")
    page.click("#submit")
    _until(page, "() => document.getElementById('form-status').textContent.startsWith('Queued as')")
    breaking = re.search(r"Queued as (\w+)", page.inner_text("#form-status")).group(1)
    job = server.call("GET", f"/v1/jobs/{breaking}")[1]
    assert job["priority"] == 100 and job["request"]["delivery"] == "web-h264"
    assert Path(job["request"]["audio"]).parent == tmp_path / "uploads"
    assert Path(job["request"]["audio"]).read_bytes() == booth.read_bytes()

    # another job, queued behind it: cancelled from the page
    victim = server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(tmp_path / "n.wav"),
                                              "output": str(tmp_path / "victim.mp4")})[1]["id"]
    page.wait_for_selector(f"{_row(victim)} button.cancel", timeout=30_000)
    page.click(f"{_row(victim)} button.cancel")
    page.wait_for_selector(f'{_row(victim)}[data-status="cancelled"]', timeout=60_000)

    # the progress bar moves as the breaking job renders, without a reload
    samples, deadline, shots = [], time.monotonic() + 300, os.environ.get("DITTO_FAST_SCREENSHOTS")
    while (s := _sample(page, breaking)) is None or s["status"] not in ("done", "failed"):
        assert time.monotonic() < deadline, samples[-5:]
        if s:
            samples.append(s)
            if shots and s["status"] == "running" and s["stage"].startswith("frames") and 0.2 < s["value"] < 0.9:
                page.screenshot(path=str(Path(shots) / "newsroom_running.png"),
                                clip={"x": 0, "y": 0, "width": 1400, "height": 560})
                shots = None
        time.sleep(0.1)
    assert s["status"] == "done" and s["value"] == 1, (s, server.log.read_text()[-2000:])
    running = [x for x in samples if x["status"] == "running" and re.fullmatch(r"\w+ \d+ / \d+", x["stage"])]
    assert running, samples
    assert len({x["value"] for x in samples + [s]}) >= 2, samples

    # its preview appears, its QC line, and its file downloads
    _until(page, "(sel) => { const i = document.querySelector(sel); return i && i.complete && i.naturalWidth > 0; }",
           f"{_row(breaking)} img.preview")
    assert "QC:" in page.inner_text(_row(breaking))
    with page.expect_download() as download:
        page.click(f"{_row(breaking)} button.download")
    output = Path(server.call("GET", f"/v1/jobs/{breaking}")[1]["output"])
    assert download.value.suggested_filename == output.name
    assert Path(download.value.path()).read_bytes() == output.read_bytes()
    assert server.wait(normal)["status"] == "done" and server.wait(victim)["status"] == "cancelled"
    if os.environ.get("DITTO_FAST_SCREENSHOTS"):
        page.screenshot(path=str(Path(os.environ["DITTO_FAST_SCREENSHOTS"]) / "newsroom_page.png"), full_page=True)

    # the token went in headers only: never in a URL, never in the server's log
    assert urls and not [u for u in urls if SERVE_TOKEN in u]
    assert SERVE_TOKEN not in server.log.read_text()
    context.close()


def test_the_page_plays_a_live_session_by_webrtc_and_says_its_latency(serving, browser, tmp_path):
    """A session with no output of its own, watched on the page: Chromium's own WebRTC decodes the picture at its
    size while speech goes in over the WebSocket, and plays every audio packet; the page shows the session's latency
    and the viewer's figures."""
    import asyncio
    import json as json_

    import numpy as np
    import soundfile as sf
    websockets = pytest.importorskip("websockets")

    token_file = tmp_path / "token"
    token_file.write_text(SERVE_TOKEN + "\n")
    server = serving("--token-file", str(token_file))
    server.token = SERVE_TOKEN
    sid = server.call("POST", "/v1/live", {"avatar": "anchor"})[1]["id"]
    page = browser.new_context(viewport={"width": 1400, "height": 1200}).new_page()
    page.goto(f"http://127.0.0.1:{server.port}/")
    page.wait_for_selector("#token-panel:not([hidden])")
    page.fill("#token", SERVE_TOKEN)
    page.click("#token-form button")
    page.wait_for_selector("#live button.watch", timeout=60_000)
    page.click("#live button.watch")
    _until(page, "() => { const v = document.getElementById('viewer'); return v.videoWidth > 0 && v.currentTime > 1; }",
           timeout=60)
    assert page.evaluate("[document.getElementById('viewer').videoWidth, "
                         "document.getElementById('viewer').videoHeight]") == [1920, 1080]
    speech, _ = sf.read(speech_clip(tmp_path, "s.wav", 4.0), dtype="float32")

    async def talk() -> None:
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/v1/live/{sid}/audio",
                                      additional_headers={"Authorization": f"Bearer {SERVE_TOKEN}"}) as ws:
            pcm = np.round(speech * 32767).astype("<i2")
            t0 = time.monotonic()
            for k, i in enumerate(range(0, len(pcm), 320)):
                await ws.send(pcm[i:i + 320].tobytes())
                await asyncio.sleep(max(0.0, t0 + (k + 1) * 0.02 - 0.5 - time.monotonic()))
            await ws.send(json_.dumps({"end": True}))
            await asyncio.sleep(4.0)
    import threading

    talker = threading.Thread(target=lambda: asyncio.run(talk()))     # Playwright's own loop runs in this thread
    talker.start()
    while talker.is_alive():
        page.wait_for_timeout(200)
    print(page.evaluate("window.dittoViewerStats"), server.call("GET", f"/v1/live/{sid}")[1])
    # what it hears: every packet played (none discarded as a duplicate of another's RTP timestamp), and after the
    # first second hardly a sample concealed (Chromium's getStats; the session's silence is packets too)
    _until(page, "() => window.dittoViewerStats && window.dittoViewerStats.audio !== null", timeout=30)
    viewer = page.evaluate("window.dittoViewerStats")      # one look: the audio's figures and the picture's buffer
    heard = viewer["audio"]
    assert heard and heard["packets_discarded"] == 0 and heard["packets_received"] >= 50 * 4, heard
    pictures = heard["frames_decoded_after_first_s"] / 25
    seen = min(pictures, heard["watched_s_after_first_s"])
    # a second of audio come for each second seen (whep.py's Opus packets carry 20 ms each): seen is what was
    # decoded, at most what the clock let pass (the frames held back in the first second are decoded in a burst
    # after it, 7.44 s of pictures in 7.0 s watched)
    assert heard["packets_after_first_s"] * 0.02 >= 0.98 * seen, heard
    # and played: where the media came evenly, hardly a sample concealed. (On a CPU shared it may come in bursts: the
    # receiver then conceals the gaps and speeds up to catch up, its jitter buffer grown; 5 % concealed with 240 ms in
    # the picture's buffer on a loaded host, 7 % on a busy CI host; 0 with 87 ms on an idle one.)
    if pictures >= 0.98 * heard["watched_s_after_first_s"] and viewer["jitter_buffer_s"] < 0.15:
        assert heard["audio_s_after_first_s"] >= 0.98 * seen and heard["concealed_after_first_s"] < 0.02, heard
    # the session's latency is known once a rendered frame carried speech; a host too busy to render one in time
    # has none (the page then says no glass-to-glass figure rather than make one up)
    measured = server.call("GET", f"/v1/live/{sid}")[1]["latency_s"] is not None
    shown = "window.dittoViewerStats && window.dittoViewerStats.glass_to_glass_s !== null"
    _until(page, f"() => {shown} && document.getElementById('viewer-stats').textContent.includes('glass to glass')"
           if measured else "() => window.dittoViewerStats && window.dittoViewerStats.frames_decoded >= 100", timeout=30)
    stats = page.evaluate("window.dittoViewerStats")
    assert stats["frames_decoded"] >= 100 and (stats["width"], stats["height"]) == (1920, 1080), stats
    if measured:
        assert 0 < stats["session_latency_s"] <= 3.0 + 0.5 and stats["glass_to_glass_s"] >= stats["session_latency_s"]
    else:
        assert stats["glass_to_glass_s"] is None and "glass to glass" not in page.inner_text("#viewer-stats")
    if os.environ.get("DITTO_FAST_VIEWER_STATS"):           # scripts/bench: docs/live.md's glass-to-glass figure
        Path(os.environ["DITTO_FAST_VIEWER_STATS"]).write_text(json_.dumps(stats))
    page.click("#viewer-close")
    _until(page, "() => document.getElementById('viewer-panel').hidden")
    assert server.call("GET", f"/v1/live/{sid}")[1]["viewers"] == 0
    assert server.call("DELETE", f"/v1/live/{sid}")[1]["state"] == "ended"
