"""The frame loop's output stage (engine/stages.py OutputStage; the engine option `output_stage`): the putback and the
encoder's pipe on a thread of their own give the same bytes as on the loop's thread; the thread's error reaches the
render, and a render stopped in the middle (a cancel) stops the thread before the writer is aborted. And the engine's
warm-up (what a CUDA engine runs when it starts) leaves the bytes alone."""

from __future__ import annotations

import threading
import time

import pytest

from ditto_fast.core.timing import StageTimer
from ditto_fast.engine.request import RenderRequest
from ditto_fast.engine.stages import OutputStage


def _output_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ditto-fast-output"]


@pytest.mark.parametrize("threaded", [False, True])
def test_batches_are_worked_in_order_inline_or_on_the_thread(threaded):
    done, timer = [], StageTimer()
    with OutputStage(lambda k, name: done.append((k, name, threading.current_thread().name)), threaded,
                     timer) as out:
        for k in range(7):
            out.put(k, f"batch {k}")
    assert [(k, name) for k, name, _ in done] == [(k, f"batch {k}") for k in range(7)]
    assert {where for *_, where in done} == {"ditto-fast-output" if threaded else threading.current_thread().name}
    assert ("handoff" in timer.seconds) == threaded and not _output_threads()


def test_the_threads_error_reaches_the_loop_at_its_next_hand_off_or_at_the_end():
    def work(k: int) -> None:
        if k == 2:
            raise RuntimeError("putback failed at batch 2")

    with pytest.raises(RuntimeError, match="batch 2"):
        with OutputStage(work, True, StageTimer(), depth=1) as out:
            for k in range(50):
                out.put(k)
                time.sleep(0.01)
    with pytest.raises(RuntimeError, match="batch 2"):            # failed on the last batch: raised on leaving
        with OutputStage(work, True, StageTimer()) as out:
            for k in range(3):
                out.put(k)
    assert not _output_threads()


def test_leaving_with_an_error_stops_the_thread_after_its_batch():
    started, done = threading.Event(), []

    def slow(k: int) -> None:
        started.set()
        time.sleep(0.2)
        done.append(k)

    with pytest.raises(KeyError):
        with OutputStage(slow, True, StageTimer(), depth=2) as out:
            for k in range(3):
                out.put(k)
            started.wait()
            raise KeyError("cancelled")
    assert done == [0] and not _output_threads()       # the queued batches 1 and 2 were dropped, the thread joined


@pytest.mark.slow
def test_the_threaded_output_stage_gives_the_same_bytes(video_avatar, clips, tmp_path, tiny_checkpoints):
    """A 0.6 s clip at 30 fps (18 frames: batches 4+4+4+4+2), with look-ahead: the file is the inline one."""
    from ditto_fast.engine.renderer import Renderer

    outs = {}
    for stage in ("inline", "thread"):
        r = Renderer(tiny_checkpoints, device="cpu", batch_size=4, output_stage=stage)
        res = r.render(RenderRequest("anchor", clips[1], tmp_path / f"{stage}.mp4", seed=3, fps=30))
        assert res.timings["frames"] == 18 and res.timings["stages"]["putback"] > 0
        assert ("handoff" in res.timings["stages"]) == (stage == "thread")
        outs[stage] = res.output.read_bytes()
    assert outs["thread"] == outs["inline"]


@pytest.mark.slow
def test_a_threaded_render_cancelled_or_failing_leaves_nothing(video_avatar, clips, tmp_path, tiny_checkpoints,
                                                                monkeypatch):
    from ditto_fast.engine.renderer import Renderer
    from ditto_fast.handles.base import JobCancelled
    from ditto_fast.render.putback import YuvPutback

    r = Renderer(tiny_checkpoints, device="cpu", batch_size=2, output_stage="thread")

    def cancel(stage: str, done: int, total: int) -> None:
        if stage == "frames" and done >= 4:
            raise JobCancelled()

    with pytest.raises(JobCancelled):
        r.render(RenderRequest("anchor", clips[1], tmp_path / "cancelled.mp4"), progress=cancel)
    paste, calls = YuvPutback.__call__, []

    def failing(self, *args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("the putback failed")
        return paste(self, *args)

    monkeypatch.setattr(YuvPutback, "__call__", failing)
    with pytest.raises(RuntimeError, match="the putback failed"):
        r.render(RenderRequest("anchor", clips[1], tmp_path / "failed.mp4"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [] and not _output_threads()


@pytest.mark.slow
def test_the_warm_up_changes_nothing_a_render_writes(engine, video_avatar, clips, tmp_path):
    """Renderer.warm_up (run by the constructor on CUDA, to spare the first clip its first-call costs) runs HuBERT,
    the LMDM and warp + decode once each and keeps nothing of it: a render after it writes the same bytes."""
    before = engine.render(RenderRequest("anchor", clips[0], tmp_path / "before.mp4", seed=4)).output.read_bytes()
    engine.warm_up()
    after = engine.render(RenderRequest("anchor", clips[0], tmp_path / "after.mp4", seed=4)).output.read_bytes()
    assert after == before
