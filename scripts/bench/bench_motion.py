"""Audio-to-keypoints benchmark: HuBERT features + LMDM windows + motion stitch, seconds per second of audio."""

from __future__ import annotations

import time

from bench_common import checkpoints, save, speech


def run(out_json: str | None, quick: bool = False) -> dict:
    """Whole audio-to-keypoints time per second of audio at 25 and 50 DDIM steps (full-size networks)."""
    import numpy as np
    import torch

    from ditto_fast import models
    from ditto_fast.audio.decode import load_audio
    from ditto_fast.audio.hubert import HubertFeatures
    from ditto_fast.checkpoints import find_checkpoints
    from ditto_fast.motion.keypoints import motion_to_info
    from ditto_fast.motion.stitch import MotionStitch
    from ditto_fast.motion.conditions import build_conditions, condition_parts, emotion_schedule
    from ditto_fast.motion.ddim import DDIMSampler
    from ditto_fast.motion.sampling import MotionSampler

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cs = find_checkpoints(checkpoints(tiny=False))
    seconds = 4.0 if quick else 10.0
    audio = load_audio(speech(seconds))
    lmdm = models.load("lmdm", cs.files["lmdm"], device)
    stitch_net = models.load("stitch_network", cs.files["stitch_network"], "cpu")
    rng = np.random.default_rng(0)
    src = {"pitch": rng.normal(size=(1, 66)).astype(np.float32), "yaw": rng.normal(size=(1, 66)).astype(np.float32),
           "roll": rng.normal(size=(1, 66)).astype(np.float32), "t": np.zeros((1, 3), np.float32),
           "exp": 0.02 * rng.normal(size=(1, 63)).astype(np.float32), "scale": np.ones((1, 1), np.float32),
           "kp": 0.2 * rng.normal(size=(1, 63)).astype(np.float32)}
    from ditto_fast.motion.keypoints import info_to_motion

    t0 = time.perf_counter()
    hubert = HubertFeatures(cs.hubert_dir, device=device)
    feats = hubert(audio)
    t_feat = time.perf_counter() - t0
    n = feats.shape[0]
    result = {"device": device, "audio_seconds": seconds, "frames": n, "hubert_s": t_feat}
    for steps in (25, 50):
        t0 = time.perf_counter()
        parts = condition_parts(lmdm.cond_dim, feats.shape[1])
        cond = build_conditions(feats, parts, emotion_schedule("neutral", n), np.zeros((1, 2), np.float32),
                                np.zeros((1, 6), np.float32), src["kp"].reshape(-1))
        sampler = MotionSampler(DDIMSampler(lmdm, steps), device=device)
        motion = sampler(cond, info_to_motion(src), torch.Generator(device=device).manual_seed(0))
        t_lmdm = time.perf_counter() - t0
        t0 = time.perf_counter()
        stitch = MotionStitch(stitch_net, is_image=True)
        for i in range(n):
            stitch(src, motion_to_info(motion[i]))
        t_stitch = time.perf_counter() - t0
        total = t_feat + t_lmdm + t_stitch
        result[f"steps{steps}"] = {"lmdm_s": t_lmdm, "stitch_s": t_stitch, "total_s": total,
                                   "s_per_audio_s": total / seconds, "stitch_ms_per_frame": 1000 * t_stitch / n}
        print(f"{steps} steps: {seconds:g} s audio -> HuBERT {t_feat:.1f} s + LMDM {t_lmdm:.1f} s + stitch "
              f"{t_stitch:.1f} s = {total:.1f} s ({total / seconds:.2f} s per second of audio)")
    return save(out_json, result)
