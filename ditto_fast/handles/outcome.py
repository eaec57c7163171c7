"""One job state machine for every engine: a checked job run on a loaded Renderer and its outcome as plain data
(what an engine process sends its parent and a Ray actor returns its driver), and that outcome turned back into the
handle's answer: the result, or JobCancelled, EngineError or EngineDied."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable

from ditto_fast.core.errors import DittoError, one_line
from ditto_fast.handles.base import EngineDied, EngineError, JobCancelled, at_memory_cap

if TYPE_CHECKING:
    from ditto_fast.handles.base import EngineJob

# an outcome: ("done", result) | ("error", line, exit_code) | ("cancelled",) | ("fatal", why): the engine must go


def internal_error(e: BaseException) -> str:
    """The one line a bug in a job's render is reported with (to the job's owner, who can render it alone)."""
    return one_line(f"internal error: {type(e).__name__}: {e}; render that request alone with `ditto-fast render` "
                    "and DITTO_FAST_DEBUG=1 and report it")


def out_of_memory(e: BaseException) -> bool:
    """Whether `e` is an allocation that failed: numpy's MemoryError, torch's allocator, a fork refused, or any
    error of native code (oneDNN: "could not create a primitive") while this process is at its memory cap."""
    text = str(e).lower()
    return isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text)) or (
        isinstance(e, OSError) and e.errno == 12) or (
        isinstance(e, (RuntimeError, OSError)) and at_memory_cap(os.getpid()) is not None)


def run_job(renderer: Any, job: EngineJob, tick: Callable[[str, int, int], None],
            commit: Callable[[], None] | None) -> tuple:
    """Check `job` against the avatar as this engine sees the store and render it; its outcome. `tick` and `commit`
    may raise JobCancelled (the outcome is then "cancelled"); a failed allocation is "fatal" (the engine goes)."""
    from ditto_fast.engine.clip import check_clip

    try:
        clip = check_clip(job.request, renderer.avatar(job.request.avatar), renderer.config, audio=job.audio)
        result = renderer.render(clip, progress=tick, commit=commit)
    except JobCancelled:
        return ("cancelled",)
    except DittoError as e:
        return ("error", str(e), e.exit_code)
    except Exception as e:  # noqa: BLE001 - said to the job's owner; the engine goes on unless memory ran out
        if out_of_memory(e):
            return ("fatal", f"out of memory ({one_line(str(e) or type(e).__name__, 200)})")
        return ("error", internal_error(e), 1)
    result.mouth = None if result.mouth is None else result.mouth.copy()
    return ("done", result)


def answer(outcome: tuple, died: Callable[[str], EngineDied]) -> Any:
    """The handle's answer to `outcome`: the result, or JobCancelled, EngineError, or `died(why)` raised (fatal)."""
    kind = outcome[0]
    if kind == "done":
        return outcome[1]
    if kind == "cancelled":
        raise JobCancelled()
    if kind == "error":
        raise EngineError(outcome[1], outcome[2])
    raise died(outcome[1])
