"""The RenderSetup an engine's options settle into before any network loads: everything that decides its outputs'
bytes (checkpoints, device, precision, batch size, encoder and its threads, crf, preset, launch, settings), and how its
frame loop runs (the output stage)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ditto_fast.checkpoints import CheckpointSet, find_checkpoints
from ditto_fast.core.config import Config
from ditto_fast.core.devices import resolve_device
from ditto_fast.core.errors import UsageError
from ditto_fast.encoding.formats import OutputFormat, nvenc_works
from ditto_fast.engine.batch_size import auto_batch_size
from ditto_fast.engine.clip import Clip
from ditto_fast.engine.digest import clip_digest
from ditto_fast.engine.emotion_auto import AUTO_SETTINGS
from ditto_fast.engine.options import EngineOptions
from ditto_fast.engine.precision import choose_precision


@dataclass
class RenderSetup:
    """Everything about an engine that decides its outputs' bytes, settled before any network loads."""

    config: Config
    checkpoints: CheckpointSet
    device: torch.device
    dtype: torch.dtype
    batch_size: int
    crf: int
    preset: str
    nvenc: bool = False              # H.264/HEVC through the GPU's encoder
    precision_choice: str = ""       # why this precision (`auto`: the CPU flags that decided it)
    batch_choice: str = ""           # why `auto` gave this batch size
    output_stage: str = "inline"     # putback + the encoder's pipe: on the frame loop's thread, or on their own
    launch: str = "eager"            # the DDIM step and warp + decode: eager, graphs or compile (core/graphs.py)
    encoder_threads: int | None = None   # x264/x265 threads (None: the encoder's own choice)

    @classmethod
    def resolve(cls, options: EngineOptions | None = None) -> "RenderSetup":
        """Find the checkpoints, pick device, precision and encoder, fill what is not given from the config.

        encoder: "software" (x264/x265), "nvenc" (the GPU's encoder; refused if it does not work here) or
        "auto" (NVENC when rendering on CUDA and it works, else software)."""
        o = options or EngineOptions()
        config = o.settings()
        cs = o.checkpoints if isinstance(o.checkpoints, CheckpointSet) else find_checkpoints(o.checkpoints)
        dev = resolve_device(o.device)
        r = config.render
        dtype, why = choose_precision(o.precision, dev)
        batch = o.batch_size or r.batch_size    # the options and the settings were checked when made
        if batch == "auto":                     # 1 on a CPU; on CUDA the probe's verdict (measured once per GPU)
            batch, batch_why = auto_batch_size(cs, dev, dtype)
        else:
            batch_why = f"{batch}: set by --batch-size or render.batch_size"
        crf = r.crf if o.crf is None else o.crf
        preset = r.preset if o.preset is None else o.preset
        threads = r.encoder_threads if o.encoder_threads is None else o.encoder_threads
        return cls(config, cs, dev, dtype, batch, crf, preset, _use_nvenc(o.encoder, dev), why, batch_why,
                   output_stage=o.output_stage or r.output_stage, launch=o.launch or r.launch,
                   encoder_threads=None if threads == "auto" else threads)

    def output_format(self, clip: Clip) -> OutputFormat:
        """The clip's format with this setup's encoder (the software one for a codec whose NVENC does not work
        here: the setup probed H.264's). A delivery's format is its profile's: encoded in software."""
        fmt = clip.format
        return fmt.with_nvenc(self.nvenc and fmt.nvenc_capable and nvenc_works(fmt.codec)[0])

    def digest(self, clip: Clip) -> str:
        """What a render of `clip` with this setup writes into its output's comment tag (see clip_digest)."""
        settings = {"checkpoints": self.checkpoints.fingerprints(), "device": self.device.type,
                    "precision": str(self.dtype), "batch_size": self.batch_size, "crf": self.crf,
                    "preset": self.preset, "encoder": self.output_format(clip).encoder,
                    "motion": dataclasses.asdict(self.config.motion)}
        if self.launch == "compile":            # compiled kernels compute otherwise; CUDA graphs replay the same ones
            settings["launch"] = self.launch
        if self.encoder_threads is not None:    # x264's bytes follow its threads
            settings["encoder_threads"] = self.encoder_threads
        if clip.emotion_auto is not None:       # what read the speech, and how (outputs without auto keep theirs)
            settings["emotion_auto"] = {"model": self.checkpoints.emotion_fingerprint(),
                                        "track": AUTO_SETTINGS.as_dict()}
        return clip_digest(clip, settings)


def _use_nvenc(encoder: str, device: torch.device) -> bool:
    """Whether to encode with NVENC: asked for (and working), or `auto` on a CUDA device where it works."""
    if encoder == "software" or (encoder == "auto" and device.type != "cuda"):
        return False
    works, why = nvenc_works("h264")
    if encoder == "nvenc" and not works:
        raise UsageError(f"NVENC does not work on this machine ({why}); use --encoder software or auto")
    return works
