"""The engine's options, declared once: device, precision, batch size, crf, preset, encoder, checkpoints and the
settings. Their choices and ranges are the config's declarations; the `render`, `batch` and `serve` options are
made from `ENGINE_FIELDS` (flags, types, choices, help), and an `EngineOptions` goes whole from the command line to
the engine (RenderSetup.resolve, in render_setup.py) and to each Ray actor. Light to import: no torch here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ditto_fast.core.config import DEVICES, ENCODERS, PRECISIONS, Config, declaration, load_config

if TYPE_CHECKING:
    from ditto_fast.checkpoints import CheckpointSet

_BATCH = declaration("render", "batch_size")


def _option(default: Any = None, *, flags: tuple[str, ...] = (), setting: tuple[str, str] | None = None,
            choices: tuple[str, ...] | None = None, kind: str = "text", help: str = "") -> Any:
    """An engine option: `flags` its command-line spelling (none: not an option of its own); `setting` names its
    config declaration (type, range, default), `choices` its allowed words; `kind` text or path."""
    return field(default=default, metadata={"flags": flags, "setting": setting, "choices": choices, "kind": kind,
                                            "help": help})


@dataclass(frozen=True)
class EngineOptions:
    """How to run the engine, as given: None (or auto) means the config's default, or what the engine chooses when
    the setup is resolved. Picklable: a Ray actor gets it whole."""

    device: str = _option("auto", flags=("--device",), choices=DEVICES)
    precision: str = _option("auto", flags=("--precision",), choices=PRECISIONS)
    batch_size: int | str | None = _option(
        flags=("--batch-size",), setting=("render", "batch_size"),
        help=f"Frames per warp+decode micro-batch: {_BATCH['low']}..{_BATCH['high']}, or auto (1 on a CPU; on a GPU "
             "the fastest per frame, measured once and kept in the store).")
    crf: int | None = _option(flags=("--crf",), setting=("render", "crf"), help="H.264 quality.")
    preset: str | None = _option(flags=("--preset",), setting=("render", "preset"), help="x264 preset.")
    encoder: str = _option("auto", flags=("--encoder",), choices=ENCODERS,
                           help="H.264/HEVC encoder: software (x264/x265), nvenc (the GPU's), or auto (NVENC when "
                                "rendering on CUDA and it works).")
    checkpoints: str | Path | CheckpointSet | None = _option(
        flags=("--checkpoints",), kind="path",
        help="Checkpoint directory (default $DITTO_FAST_CHECKPOINTS or ./checkpoints).")
    config: Config | None = _option()      # the settings (None: the packaged defaults), read from `--config FILE`

    def settings(self) -> Config:
        """The settings in effect: `config`, or the packaged defaults."""
        return self.config or load_config()

    def find_checkpoints(self) -> CheckpointSet:
        """The checkpoint set these options name (CheckpointError if it is missing or incomplete)."""
        from ditto_fast.checkpoints import CheckpointSet, find_checkpoints

        return self.checkpoints if isinstance(self.checkpoints, CheckpointSet) else find_checkpoints(self.checkpoints)


ENGINE_FIELDS: tuple[dataclasses.Field, ...] = dataclasses.fields(EngineOptions)
