"""`--emotion auto`: what reading the speech's emotion costs.

- classifier: the full-size (random) speech-emotion classifier, the large XLSR wav2vec2 of
  r-f/wav2vec-english-speech-emotion-recognition, over `seconds` of speech in the render's windows (4 s every 2 s,
  batched), beside full-size HuBERT's features of the same speech: seconds of each per minute of speech.
- render: a tiny-network render (a 960x540 anchor) with `--emotion neutral` and with `--emotion auto` (the full-size
  classifier), the engine warm: what auto adds to its wall time, and the classifier's load in the first one.

    python scripts/benchmark.py emotion [--quick]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from bench_common import CACHE, anchor, checkpoints, save, speech


def _full_classifier() -> Path:
    """The cached full-size random classifier folder."""
    from ditto_fast.checkpoints.random_emotion import write_random_emotion

    folder = CACHE / "emotion_full_seed0"
    if not (folder / "config.json").is_file():
        write_random_emotion(folder, tiny=False, seed=0)
    return folder


def classifier(quick: bool) -> dict:
    """Seconds per minute of speech: the classifier's windows, HuBERT's features."""
    import torch

    from ditto_fast.audio.decode import load_audio
    from ditto_fast.audio.emotion import SpeechEmotion
    from ditto_fast.audio.hubert import HubertFeatures
    from ditto_fast.checkpoints.random_hubert import write_random_hubert
    from ditto_fast.engine.emotion_auto import AUTO_SETTINGS

    seconds = 10.0 if quick else 60.0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    samples = load_audio(speech(seconds))
    t0 = time.perf_counter()
    model = SpeechEmotion.load(_full_classifier(), device=device)
    load_s = time.perf_counter() - t0
    model.windows(samples[:64000], AUTO_SETTINGS.window, AUTO_SETTINGS.hop)         # warm-up
    t0 = time.perf_counter()
    windows = model.windows(samples, AUTO_SETTINGS.window, AUTO_SETTINGS.hop)
    emotion_s = time.perf_counter() - t0
    hubert_dir = CACHE / "hubert_full_seed0"
    if not (hubert_dir / "vocab.json").is_file():
        write_random_hubert(hubert_dir, tiny=False, seed=0)
    hf = HubertFeatures(hubert_dir, device=device)
    hf.features(samples[:16000])
    t0 = time.perf_counter()
    hf.features(samples)
    hubert_s = time.perf_counter() - t0
    per_min = 60.0 / seconds
    params = sum(p.numel() for p in model.encoder.parameters())
    return {"seconds_of_speech": seconds, "device": device, "threads": torch.get_num_threads(),
            "params_m": round(params / 1e6, 1), "load_s": load_s, "windows": len(windows.starts),
            "window_s": AUTO_SETTINGS.window, "hop_s": AUTO_SETTINGS.hop,
            "emotion_s_per_min": emotion_s * per_min, "hubert_s_per_min": hubert_s * per_min}


def render(quick: bool) -> dict:
    """A tiny render's wall seconds with --emotion neutral and auto (the full-size classifier), warm engine."""
    from ditto_fast.avatar.register import register_avatar
    from ditto_fast.checkpoints import EMOTION_DIRNAME
    from ditto_fast.engine.renderer import Renderer
    from ditto_fast.engine.request import RenderRequest

    seconds = 4.0 if quick else 10.0
    tiny = checkpoints(tiny=True)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "ckpt"                 # the tiny networks and HuBERT, the full-size classifier beside them
        root.mkdir()
        for entry in tiny.iterdir():
            if entry.name != EMOTION_DIRNAME:
                (root / entry.name).symlink_to(entry)
        (root / EMOTION_DIRNAME).symlink_to(_full_classifier())
        os.environ["DITTO_FAST_HOME"] = str(Path(d) / "home")
        register_avatar(anchor(25, size=(960, 540)), name="bench", force=True, checkpoints=root,
                        device="cpu")
        engine = Renderer(root, device="cpu")
        audio = speech(seconds)
        runs = {}
        for name, emotion in (("neutral", "neutral"), ("auto_first", "auto"), ("neutral_again", "neutral"),
                              ("auto", "auto")):
            t = engine.render(RenderRequest("bench", audio, Path(d) / f"{name}.mp4", emotion=emotion)).timings
            runs[name] = {"wall_s": t["wall_seconds"], "load_models_s": t["stages"]["load_models"],
                          "audio_features_s": t["stages"]["audio_features"],
                          "emotion_s": t.get("emotion", {}).get("seconds")}
    added = runs["auto"]["wall_s"] - runs["neutral_again"]["wall_s"]
    return {"seconds_of_speech": seconds, "frames": int(seconds * 25), "runs": runs, "auto_adds_s": added,
            "classifier_load_s": runs["auto_first"]["load_models_s"]}


def run(out_json: str | None, quick: bool = False) -> dict:
    """The classifier's cost per minute of speech and what auto adds to a tiny render; prints the table."""
    result = {"classifier": classifier(quick)}
    c = result["classifier"]
    print(f"\nspeech-emotion classifier, full size ({c['params_m']}M params), {c['seconds_of_speech']:g} s of speech "
          f"on {c['device']} ({c['threads']} threads), {c['windows']} windows of {c['window_s']:g} s every "
          f"{c['hop_s']:g} s:")
    print(f"  {c['emotion_s_per_min']:.1f} s per minute of speech (HuBERT's features: {c['hubert_s_per_min']:.1f}); "
          f"load {c['load_s']:.1f} s", flush=True)
    result["render"] = r = render(quick)
    print(f"tiny render of {r['seconds_of_speech']:g} s ({r['frames']} frames), full-size classifier:")
    for name, run_ in r["runs"].items():
        emo = f", emotion {run_['emotion_s']:.2f} s" if run_["emotion_s"] is not None else ""
        print(f"  {name:14} wall {run_['wall_s']:.2f} s, audio_features {run_['audio_features_s']:.2f} s{emo}")
    print(f"  auto adds {r['auto_adds_s']:.2f} s warm; its first render loads the classifier "
          f"({r['classifier_load_s']:.1f} s in load_models)")
    return save(out_json, result)


if __name__ == "__main__":
    run(None, quick="--quick" in sys.argv)
