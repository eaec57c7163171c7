"""The engine's options, declared once: device, precision, batch size, crf, preset, encoder, output stage, launch,
encoder threads, checkpoints and the settings. Their choices and ranges are the config's declarations; the `render`,
`batch` and `serve` options are made from `ENGINE_FIELDS` (flags, types, choices, help), and an `EngineOptions` goes
whole from the command line to the engine (RenderSetup.resolve, in render_setup.py) and to each Ray actor. Light to
import: no torch here.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ditto_fast.core.checks import refuse
from ditto_fast.core.config import DEVICES, ENCODERS, PRECISIONS, Config, declaration, load_config
from ditto_fast.core.declare import check_fields, declared
from ditto_fast.core.files import shown

if TYPE_CHECKING:
    from ditto_fast.checkpoints import CheckpointSet

_BATCH = declaration("render", "batch_size")


def _device(value: Any, where: str) -> str:
    """One of DEVICES, or one GPU named as cuda:N (from Python)."""
    if isinstance(value, str) and (value in DEVICES or re.fullmatch(r"cuda:\d+", value)):
        return value
    refuse(where, f"must be one of {', '.join(DEVICES)} (or cuda:N), got {shown(value)}")


def _checkpoints(value: Any, where: str) -> str | Path | CheckpointSet:
    """A checkpoint directory as given (str or Path), or a CheckpointSet already found."""
    found = sys.modules.get("ditto_fast.checkpoints")      # a CheckpointSet exists only once that is imported
    if isinstance(value, (str, Path)) and str(value) or found and isinstance(value, found.CheckpointSet):
        return value
    refuse(where, f"must be a checkpoint directory, got {shown(value)}")


def _config(value: Any, where: str) -> Config:
    if not isinstance(value, Config):
        refuse(where, f"must be the settings (a Config, from load_config), got {shown(value)}")
    return value


@dataclass(frozen=True)
class EngineOptions:
    """How to run the engine, as given: None (or auto) means the config's default, or what the engine chooses when
    the setup is resolved. Checked when made (UsageError naming the option and what it allows); picklable: a Ray
    actor gets it whole."""

    device: str = declared("auto", flags=("--device",), choices=DEVICES, check=_device)
    precision: str = declared("auto", flags=("--precision",), choices=PRECISIONS)
    batch_size: int | str | None = declared(
        flags=("--batch-size",), setting=("render", "batch_size"),
        help=f"Frames per warp+decode micro-batch: {_BATCH['low']}..{_BATCH['high']}, or auto (1 on a CPU; on a GPU "
             "the fastest per frame, measured once and kept in the store).")
    crf: int | None = declared(flags=("--crf",), setting=("render", "crf"), help="H.264 quality.")
    preset: str | None = declared(flags=("--preset",), setting=("render", "preset"), help="x264 preset.")
    encoder: str = declared("auto", flags=("--encoder",), choices=ENCODERS,
                            help="H.264/HEVC encoder: software (x264/x265), nvenc (the GPU's), or auto (NVENC when "
                                 "rendering on CUDA and it works).")
    output_stage: str | None = declared(
        flags=("--output-stage",), setting=("render", "output_stage"),
        help="Where each frame's putback and its hand-off to the encoder run: inline (on the frame loop's thread, "
             "between the networks' batches) or thread (a thread of their own, so the networks never wait for them); "
             "the same bytes either way.")
    launch: str | None = declared(
        flags=("--launch",), setting=("render", "launch"),
        help="How the LMDM's DDIM step and warp + decode reach the device: eager (kernel by kernel), graphs (each "
             "captured once as a CUDA graph and replayed: the same numbers; a CPU runs eager) or compile "
             "(torch.compile, mode reduce-overhead: other numbers, so other bytes and digests; minutes to compile).")
    encoder_threads: int | str | None = declared(
        flags=("--encoder-threads",), setting=("render", "encoder_threads"),
        help="x264/x265 threads: auto (the encoder's own, 1.5 a core: its bytes differ from one host's core count to "
             "another's) or N (the same bytes on every host).")
    checkpoints: str | Path | CheckpointSet | None = declared(
        flags=("--checkpoints",), kind="path", check=_checkpoints,
        help="Checkpoint directory (default $DITTO_FAST_CHECKPOINTS or ./checkpoints).")
    config: Config | None = declared(kind="any", check=_config)   # the settings (None: the packaged defaults)

    def __post_init__(self) -> None:
        check_fields(self)

    def settings(self) -> Config:
        """The settings in effect: `config`, or the packaged defaults."""
        return self.config or load_config()

    def find_checkpoints(self) -> CheckpointSet:
        """The checkpoint set these options name (CheckpointError if it is missing or incomplete)."""
        from ditto_fast.checkpoints import CheckpointSet, find_checkpoints

        return self.checkpoints if isinstance(self.checkpoints, CheckpointSet) else find_checkpoints(self.checkpoints)


ENGINE_FIELDS: tuple[dataclasses.Field, ...] = dataclasses.fields(EngineOptions)
