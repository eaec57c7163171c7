"""What an output was made from, as a short string written into its comment tag: the same inputs and settings
give the same digest, so batch skips a job whose output already carries it. Made from the Clip's own record of
its inputs (the audio's, schedule's and controls' sha256 taken when they were read), no file read again."""

from __future__ import annotations

import hashlib
import json
import pickle

from ditto_fast.avatar import Avatar
from ditto_fast.core.version import __version__
from ditto_fast.engine.clip import Clip
from ditto_fast.media.ffpipe import container_comment
from ditto_fast.media.rates import rate_text
from ditto_fast.delivery.format import programme_chain


def _avatar_record_hash(avatar: Avatar) -> str:
    """A hash of the loaded avatar's record: its files' checksums, source and creation time."""
    m = avatar.meta
    return hashlib.sha256(pickle.dumps((m["checksums"], m["source"], m["created"]), protocol=5)).hexdigest()


def clip_digest(clip: Clip, settings: dict) -> str:
    """The digest of `clip` rendered with the engine `settings` (checkpoints, device, precision, encoder, ...)."""
    parts = {
        "version": __version__, "audio": clip.audio.sha256, "seed": clip.seed, "steps": clip.steps,
        "emotion": clip.emotion_source, "rate": rate_text(clip.rate), "container": clip.format.container,
        "codec": clip.format.codec, "controls": clip.controls_sha256, "avatar": _avatar_record_hash(clip.avatar),
        **settings,
    }
    if clip.emotion_strength != 1.0:   # likewise outputs made before the strength was a setting
        parts["emotion_strength"] = clip.emotion_strength
    if clip.blend != "feather":        # outputs made before the blend was a setting keep their digests
        parts["blend"] = clip.blend
    if clip.delivery is not None:      # likewise outputs made without a delivery profile
        parts["delivery"] = {"profile": clip.delivery.sha256, "loudness": clip.loudness,
                             "timecode": clip.format.timecode, "size": list(clip.format.size),
                             "programme": programme_chain(clip.delivery)}    # its DC blocker made other bytes
    if clip.captions is not None:      # likewise outputs made without captions
        c = clip.captions
        parts["captions"] = {"file": c.sha256, "timed": c.cues is not None, "embed": c.embed, "channel": c.channel,
                             "burn_in": c.burn_in}
    track = clip.soundtrack
    if track is not None and (track.mix is not None or track.channels > 2 or track.gain_db):   # else as before
        parts["soundtrack"] = [track.channels, track.filters()]
    return f"ditto-fast {__version__} " + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def clip_is_finished(clip: Clip, setup) -> bool:
    """Whether the clip's output exists and was made from the same inputs and settings (its digest tag, as
    `setup`, a RenderSetup, makes it)."""
    return clip.output.exists() and container_comment(clip.output) == setup.digest(clip)
