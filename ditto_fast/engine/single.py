"""One render as `ditto-fast render` makes it: every input and side file checked before a network loads, the
output claimed for the whole render, then the clip, its timings JSON and its preview PNG."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Iterable

from ditto_fast.avatar import load_avatar
from ditto_fast.core.memory import reuse_freed_memory
from ditto_fast.encoding.writer import check_output_path
from ditto_fast.engine.clip import Clip, check_clip
from ditto_fast.engine.emotion_auto import check_emotion_model
from ditto_fast.engine.options import EngineOptions
from ditto_fast.engine.render_setup import RenderSetup
from ditto_fast.engine.renderer import Renderer, RenderResult
from ditto_fast.engine.request import RenderRequest
from ditto_fast.engine.stages import Progress
from ditto_fast.media.claims import claimed
from ditto_fast.media.outputs import check_writes, write_json
from ditto_fast.preview.paths import check_png_path


def render_one(request: RenderRequest, options: EngineOptions, *, load: Callable[[RenderSetup], Renderer],
               timings: Path | None = None, preview: Path | None = None, reads: Iterable[Path | None] = (),
               note: Callable[[str], None] | None = None, progress: Progress | None = None) -> RenderResult:
    """Render `request` with the engine `load(setup)` gives (handles/local.py's load_renderer, the one place the
    networks load); also write the stage timings JSON at `timings` and the preview PNG at `preview` when given. The
    audio is decoded, the avatar opened and every file to be written checked against every input (`reads`: more of
    them, such as the config file) before the networks load; `note` hears what the check noticed. Sets the process's
    memory policy for the render loop (reuse_freed_memory)."""
    checkpoints = options.find_checkpoints()
    config = options.settings()
    clip = check_clip(request, load_avatar(request.avatar, checkpoints=checkpoints), config)
    check_emotion_model(clip, checkpoints)
    for text in clip.notes if note else ():
        note(text)
    if preview is not None:
        check_png_path(preview)
    if timings is not None:
        check_output_path(timings, example="timings.json")
    check_writes([("output", clip.output), ("timings file (--timings)", timings), ("preview", preview)],
                 [*clip.inputs, *reads, checkpoints.root])
    with claimed(clip.output):      # taken before the networks load: a second writer of this output fails fast
        reuse_freed_memory()
        setup = RenderSetup.resolve(dataclasses.replace(options, checkpoints=checkpoints, config=config))
        result = load(setup).render(clip, progress=progress)
    if timings is not None:
        write_json(timings, result.timings)
    if preview is not None:
        write_preview(preview, result, clip)
    return result


def write_preview(path: Path, result: RenderResult, clip: Clip) -> Path:
    """The preview PNG of a finished render of `clip`: thumbnails of the output, the waveform, the generated lip
    opening, the face close-ups, and with `--emotion auto` the emotion read from the speech."""
    from ditto_fast.preview.render_strip import write_render_preview

    return write_render_preview(path, result.output, clip.request.audio, result.timings["frames"],
                                result.timings["rate"], mouth=result.mouth, M_c2o=clip.avatar.M_c2o,
                                size=clip.avatar.size, random_weights=result.timings["random_weights"],
                                emotion=result.emotion)
