"""Checkpoints: locate the directory and fingerprint its files (here); write random ones in the published layout
(`random_weights.py`, with HuBERT's in `random_hubert.py`: they serve `checkpoints init-random`, which the demo uses)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from ditto_fast.core.errors import CheckpointError
from ditto_fast.models import NETWORK_NAMES, SPECS, is_random, load

MODELS_SUBDIR = Path("ditto_pytorch") / "models"
HUBERT_DIRNAMES = ("hubert-large-ls960-ft", "hubert")
# the speech-emotion classifier `--emotion auto` reads (FLOAT's Audio2Emotion): optional, beside HuBERT
EMOTION_DIRNAME = "wav2vec-english-speech-emotion-recognition"
EMOTION_LABELS = ("angry", "disgust", "fear", "happy", "neutral", "sad", "surprise")    # its seven, FLOAT's order
GET_EMOTION = ("download r-f/wav2vec-english-speech-emotion-recognition into it, or run "
               "`ditto-fast checkpoints init-random DIR`")
RANDOM_MARKER = "RANDOM_WEIGHTS.json"
GET_THEM = ("download the Ditto PyTorch release (ditto_pytorch/models/*.pth) and "
            "facebook/hubert-large-ls960-ft into it, or run `ditto-fast checkpoints init-random DIR`")


@dataclass
class CheckpointSet:
    """Paths of the six network files and the HuBERT directory under one checkpoint root."""

    root: Path
    files: dict[str, Path]
    hubert_dir: Path
    random_weights: bool = False
    _fingerprints: dict[str, str] = field(default_factory=dict, repr=False)
    _loaded: set[str] = field(default_factory=set, repr=False)

    def fingerprints(self) -> dict[str, str]:
        """Short content fingerprints of every network file and the HuBERT weights (cached)."""
        if not self._fingerprints:
            fp = {name: file_fingerprint(p) for name, p in self.files.items()}
            weights = sorted(self.hubert_dir.glob("*.safetensors")) + sorted(self.hubert_dir.glob("*.bin"))
            fp["hubert"] = file_fingerprint(weights[0]) if weights else "missing"
            self._fingerprints = fp
        return dict(self._fingerprints)

    @property
    def emotion_dir(self) -> Path:
        """Where the speech-emotion classifier's folder is (present or not)."""
        return self.root / EMOTION_DIRNAME

    def has_emotion(self) -> bool:
        """Whether the speech-emotion classifier's folder is there (its config.json)."""
        return (self.emotion_dir / "config.json").is_file()

    def require_emotion(self) -> Path:
        """The speech-emotion classifier's folder; CheckpointError naming it when it is missing (`--emotion auto`)."""
        if not self.has_emotion():
            raise CheckpointError(f"{self.emotion_dir}: speech-emotion model directory missing (config.json not "
                                  f"found); --emotion auto needs it: {GET_EMOTION}")
        return self.emotion_dir

    def emotion_fingerprint(self) -> str:
        """A short content fingerprint of the speech-emotion weights ("missing" without them)."""
        weights = sorted(self.emotion_dir.glob("*.safetensors")) + sorted(self.emotion_dir.glob("*.bin"))
        return file_fingerprint(weights[0]) if weights else "missing"

    def avatar_fingerprints(self) -> dict[str, str]:
        """Fingerprints of the networks an avatar cache depends on (registration side)."""
        fp = self.fingerprints()
        return {k: fp[k] for k in ("appearance_extractor", "motion_extractor")}

    def any_random(self, *nets: object) -> bool:
        """Whether what these loaded networks make is noise: the set is marked random or any of them was loaded
        from an init-random file."""
        return self.random_weights or is_random(*nets)

    def check_loads(self, names: Iterable[str]) -> None:
        """Load each named network's file once (cached): CheckpointError naming the first that is unreadable or not
        that network, so a broken file is not mistaken for other checkpoints."""
        for name in names:
            if name in self.files and name not in self._loaded:
                load(name, self.files[name], fuse=False)
                self._loaded.add(name)


def file_fingerprint(path: Path, block: int = 1 << 20) -> str:
    """sha256 over size, first, middle and last MiB of a file: cheap, and changes with any re-export.
    CheckpointError naming the file if it cannot be read."""
    h = hashlib.sha256()
    try:
        size = path.stat().st_size
        h.update(str(size).encode())
        with open(path, "rb") as f:
            for off in sorted({0, max(0, size // 2 - block // 2), max(0, size - block)}):
                f.seek(off)
                h.update(f.read(block))
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read the checkpoint file ({e.strerror or e}); check its permissions "
                              "or copy it again") from None
    return h.hexdigest()[:16]


def resolve_root(explicit: str | os.PathLike | None = None) -> Path:
    """--checkpoints DIR, else $DITTO_FAST_CHECKPOINTS, else ./checkpoints."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("DITTO_FAST_CHECKPOINTS")
    return Path(env).expanduser() if env else Path("checkpoints")


def find_checkpoints(explicit: str | os.PathLike | None = None, need_hubert: bool = True,
                     networks: tuple[str, ...] = NETWORK_NAMES) -> CheckpointSet:
    """The checkpoint set under the resolved root (the given networks); CheckpointError naming what is
    missing and where to get it."""
    root = resolve_root(explicit)
    if not root.is_dir():
        raise CheckpointError(f"{root}: checkpoint directory not found; {GET_THEM}")
    files = {name: root / MODELS_SUBDIR / SPECS[name].filename for name in networks}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{missing[0]}: checkpoint file missing{more}; {GET_THEM}")
    hubert = next((root / d for d in HUBERT_DIRNAMES if (root / d).is_dir()), root / HUBERT_DIRNAMES[0])
    if need_hubert and not (hubert / "config.json").is_file():
        raise CheckpointError(f"{hubert}: HuBERT model directory missing (config.json not found); {GET_THEM}")
    marker = root / MODELS_SUBDIR / RANDOM_MARKER
    return CheckpointSet(root=root, files=files, hubert_dir=hubert, random_weights=marker.is_file())
