"""Settings: types and allowed ranges here, values in `configs/default.yaml` (the one place defaults and delivery
profiles live: the top-level `configs/` of a checkout, installed as `ditto_fast/configs/` by pip).

A user YAML (`--config FILE`) overrides any subset; every value is checked by type and range when
read, and a bad one is refused naming the file and the key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ditto_fast.core.checks import check_choice, check_flag, check_number, check_text
from ditto_fast.core.errors import UsageError
from ditto_fast.core.files import read_bounded, shown, unreadable


def _config_dir() -> Path:
    """`configs/`: inside the package (a wheel's copy, or in a checkout the link to the top-level configs/), else
    the checkout's top level (a checkout made without links)."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "configs"
    return installed.resolve() if (installed / "default.yaml").is_file() else package.parent / "configs"


CONFIG_DIR = _config_dir()
DEFAULT_YAML = CONFIG_DIR / "default.yaml"
X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow")
CODECS = ("h264", "hevc", "prores")
BLENDS = ("seamless", "feather")
SOURCE_COLOURS = ("auto", "bt601", "bt709")   # a video's matrix: as tagged (untagged: by size), or the one named
# the engine's choices (engine/options.py): `auto` is the engine's own choice on the machine it runs on
DEVICES = ("auto", "cpu", "cuda")               # a Python caller may also name one GPU: cuda:1
PRECISIONS = ("auto", "fp16", "bf16", "fp32")   # the networks' dtype (fp16 on a GPU only)
ENCODERS = ("auto", "software", "nvenc")        # H.264/HEVC: x264/x265, or the GPU's NVENC
# how the networks' kernels are launched (render/fused.py, motion/ddim.py; core/graphs.py): one by one as called,
# captured once as CUDA graphs and replayed (a CPU runs them as called), or compiled by torch.compile
LAUNCHES = ("eager", "graphs", "compile")
# where a render's putback and the encoder's pipe run: on the frame loop's thread, or on a thread of their own
OUTPUT_STAGES = ("inline", "thread")


def setting(kind: type, low: float | None = None, high: float | None = None,
            choices: tuple[str, ...] | None = None, words: tuple[str, ...] = ()) -> Any:
    """A config field of type `kind`, allowed in [low, high] or among `choices`, or one of `words` (such as
    "auto") beside a number's range; its value comes from YAML."""
    return field(metadata={"kind": kind, "low": low, "high": high, "choices": choices, "words": words})


@dataclass
class RegisterConfig:
    max_size: int = setting(int, 64, 8192)            # long side of decoded frames
    batch_size: int = setting(int, 1, 256)            # crops per extractor batch
    crop_scale: float = setting(float, 0.5, 10.0)     # crop side / face box side
    crop_vx: float = setting(float, -1.0, 1.0)        # crop centre shift, fractions of the box side
    crop_vy: float = setting(float, -1.0, 1.0)
    crop_smooth_window: int = setting(int, 1, 101)    # frames, centred smoothing of crop parameters (video)
    info_smooth_window: int = setting(int, 1, 101)    # frames, centred mean over x_s_info (video)
    min_face_px: int = setting(int, 8, 4096)
    mouth_open_threshold: float = setting(float, 0.0, 2.0)   # inner-lip gap / mouth width counted as open
    mouth_open_share: float = setting(float, 0.0, 1.0)       # warn when more frames than this are open
    source_colour: str = setting(str, choices=SOURCE_COLOURS)  # the matrix of a video's pixels
    face: int | str = setting(int, 1, 99, words=("largest", "left", "right"))  # which of several faces (N: from the left)


@dataclass
class MotionConfig:
    steps: int = setting(int, 1, 1000)                # DDIM steps
    guidance: float = setting(float, 0.0, 20.0)       # classifier-free guidance weight
    overlap: int = setting(int, 1, 79)                # frames cross-faded between 80-frame LMDM windows
    smooth_window: int = setting(int, 1, 31)          # centred mean over the pose/scale/translation dims


@dataclass
class ClipConfig:
    """Each clip's own settings (a render request's fields); per render they come from options or job lines."""

    seed: int = setting(int, 0, 2**63 - 1)            # the LMDM's noise: the same seed gives the same output
    emotion: str = setting(str)                       # a label, a mix (happy+surprise), auto, or a schedule file
    emotion_strength: float = setting(float, 0.0, 1.0)    # the emotion blended toward neutral: 1 as given, 0 neutral
    codec: str = setting(str, choices=CODECS)         # video codec; the output's extension picks the container


@dataclass
class RenderConfig:
    batch_size: int | str = setting(int, 1, 64, words=("auto",))  # frames per warp+decode micro-batch
    crf: int = setting(int, 0, 51)                    # H.264 quality
    preset: str = setting(str, choices=X264_PRESETS)  # x264 preset
    lookahead: bool = setting(bool)                   # next batch's warp+decode launched before this one is written
    blend: str = setting(str, choices=BLENDS)         # putback: seamless (face mask, seam colour-matched) or feather
    output_stage: str = setting(str, choices=OUTPUT_STAGES)   # putback + encoder's pipe: the loop's thread or their own
    launch: str = setting(str, choices=LAUNCHES)      # the LMDM's DDIM step and warp + decode: eager, graphs, compile
    encoder_threads: int | str = setting(int, 1, 128, words=("auto",))   # x264/x265 threads (auto: the encoder's own)


@dataclass
class LiveConfig:
    overlap: int = setting(int, 40, 79)               # the online loop's overlap: 80 - overlap new frames a window
    max_latency: float = setting(float, 0.5, 60.0)    # seconds the stream may lag its speech at most


@dataclass
class Config:
    register: RegisterConfig
    motion: MotionConfig
    clip: ClipConfig
    render: RenderConfig
    live: LiveConfig


_SECTION_CLASSES = {"register": RegisterConfig, "motion": MotionConfig, "clip": ClipConfig, "render": RenderConfig,
                    "live": LiveConfig}


def _check(value: Any, meta: dict, where: str) -> Any:
    """`value` converted to the setting's type, or UsageError naming `where` and what is allowed."""
    kind, choices = meta["kind"], meta["choices"]
    if kind is bool:
        return check_flag(value, where)
    if choices is not None:
        return check_choice(value, choices, where)
    if kind is str:
        return check_text(value, where)
    return check_number(value, meta["low"], meta["high"], where, integer=kind is int, words=meta["words"])


def check_setting(section: str, key: str, value: Any, where: str) -> Any:
    """`value` checked as the setting `section.key` is when a file is read (type, range, words);
    UsageError naming `where` and what is allowed."""
    return _check(value, declaration(section, key), where)


def declaration(section: str, key: str) -> dict:
    """The declared type and allowed values of one setting: kind, low, high, choices, words."""
    fields = {f.name: f for f in dataclasses.fields(_SECTION_CLASSES[section])}
    return dict(fields[key].metadata)


YAML_MAX_BYTES = 1 << 20            # a settings file or a delivery profile is a few kilobytes


class _AliasFound(Exception):
    """An alias (*name) in a settings file, at `args[0]` (a yaml Mark)."""


@lru_cache(maxsize=1)
def _no_alias_loader() -> type:
    """yaml's safe loader less aliases: a few hundred bytes of nested aliases expand past any memory. Made when the
    first file is read: a command that reads none (--help, a usage error) does not import yaml."""
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise _AliasFound(self.peek_event().start_mark)
            return super().compose_node(parent, index)

    return NoAliasLoader


def read_yaml_file(path: Path, what: str, shown_as: str | None = None) -> Any:
    """The parsed YAML of a settings file or delivery profile (`what`, for messages); UsageError naming the file
    (as `shown_as`) for bad YAML or an alias (*name), InputError for a missing or unreadable file, a FIFO, a device
    or a file over 1 MiB."""
    import yaml

    name = shown_as or str(path)
    try:
        text = read_bounded(path, YAML_MAX_BYTES, what).decode("utf-8")
        return yaml.load(text, Loader=_no_alias_loader())      # noqa: S506 - a SafeLoader, less aliases
    except _AliasFound as e:
        raise UsageError(f"{name}: line {e.args[0].line + 1}: YAML aliases (*name) are not allowed in {what}; write "
                         "the value out") from None
    except yaml.YAMLError as e:
        raise UsageError(f"{name}: not valid YAML ({str(e).splitlines()[0]})") from None
    except RecursionError:
        raise UsageError(f"{name}: not valid YAML (nested too deep)") from None
    except UnicodeDecodeError:
        raise UsageError(f"{name}: not valid YAML (not UTF-8 text)") from None
    except OSError as e:
        raise unreadable(name, e, what) from None


def _read_yaml(path: Path) -> dict:
    data = read_yaml_file(path, "a config file") or {}
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of sections ({', '.join(_SECTION_CLASSES)})")
    return data


def _merge(values: dict[str, dict], data: dict, path: Path) -> None:
    """Check `data` (one YAML file) key by key and write its values into `values`."""
    for section, entries in data.items():
        cls = _SECTION_CLASSES.get(section)
        if cls is None:
            raise UsageError(f"{path}: unknown section {shown(section)}; known: {', '.join(_SECTION_CLASSES)}")
        if not isinstance(entries, dict):
            raise UsageError(f"{path}: {section} must be a mapping of settings")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key, value in entries.items():
            if key not in fields:
                raise UsageError(f"{path}: unknown setting {shown(key)} in {section}; known: {', '.join(fields)}")
            values[section][key] = _check(value, fields[key].metadata, f"{path}: {section}.{key}")


@lru_cache(maxsize=1)
def _defaults() -> dict[str, dict]:
    values: dict[str, dict] = {s: {} for s in _SECTION_CLASSES}
    _merge(values, _read_yaml(DEFAULT_YAML), DEFAULT_YAML)
    return values


def default(section: str, key: str) -> Any:
    """The packaged default of one setting (for help texts)."""
    return _defaults()[section][key]


def load_config(path: str | Path | None = None) -> Config:
    """The packaged defaults, overridden by the YAML at `path` when given; every value checked."""
    values = {s: dict(v) for s, v in _defaults().items()}
    if path is not None:
        path = Path(path)
        _merge(values, _read_yaml(path), path)
    return Config(**{s: cls(**values[s]) for s, cls in _SECTION_CLASSES.items()})
