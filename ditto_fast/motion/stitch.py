"""Motion stitch: source + generated motion -> (x_s, x_d) keypoints for the warp network, per frame.

Steps for each frame, as Ditto does them (numpy, batch 1):
  1. relative driving: d = s + (d - d0), d0 the first driving frame seen (pose mixed as bin logits);
     image avatars take expression, pose and translation from d, video avatars only the expression;
  2. expression masks: lip keypoints always from d, eye keypoints from d for image avatars
     (video avatars keep the plate's eyes), every other keypoint from the source;
  3. controls (motion/controls.py): pose/expression scale, offsets, blinks, fade to the source;
  4. gaze fix (image avatars): shift the eye keypoints with the head's yaw/pitch change;
  5. keypoint transform, then the stitching network on (x_s, x_d).
"""

from __future__ import annotations

import numpy as np
import torch

from ditto_fast.motion.controls import Controls, FrameControl
from ditto_fast.motion.keypoints import NUM_KP, _np32, pose_degrees, transform_keypoints

EYE_KP = (11, 13, 15, 16, 18)
LIP_KP = (6, 12, 14, 17, 19, 20)
POSE_KEYS = ("pitch", "yaw", "roll")
# Gaze fix: expression shift of the two eye-centre keypoints per degree of head yaw/pitch change.
GAZE_X_RATIO, GAZE_Y_RATIO = 0.26, 0.28
GAZE_KP = (11, 15)


def _mask(kps: tuple[int, ...]) -> np.ndarray:
    m = np.zeros((NUM_KP, 3), dtype=np.float32)
    m[list(kps)] = 1
    return m.reshape(1, -1)  # [1, 63]


def _fix_gaze(exp: np.ndarray, d_yaw: np.ndarray, d_pitch: np.ndarray) -> np.ndarray:
    """Move the eye-centre keypoints against the head turn so the eyes keep looking at the camera.

    exp [B, 63] float32, head turn in degrees [B]; the shifts are computed and added in float64."""
    dx = d_yaw.astype(np.float64) * GAZE_X_RATIO
    dy = d_pitch.astype(np.float64) * GAZE_Y_RATIO
    exp = exp.copy()
    (ax, ay), (bx, by) = ((3 * k, 3 * k + 1) for k in GAZE_KP)
    for col, shift in ((ax, dx * np.where(dx > 0, 0.0007, 0.001)), (bx, dx * np.where(dx > 0, 0.001, 0.0007)),
                       (ay, -dy * 0.001), (by, -dy * 0.001)):
        exp[:, col] = (exp[:, col].astype(np.float64) + shift).astype(np.float32)
    return exp


def _close_eyes(info: dict, closure: float) -> np.ndarray:
    """Expression with each eye's keypoints pulled to that eye's mean height (closure 0..1)."""
    kp = _np32(info["kp"]).reshape(NUM_KP, 3)
    exp = info["exp"].reshape(NUM_KP, 3).copy()
    rot_free = kp + exp                             # eye heights before pose: closing is pose-independent
    eye = np.array(EYE_KP)
    centre_x = rot_free[:, 0].mean()
    for side in (rot_free[eye, 0] < centre_x, rot_free[eye, 0] >= centre_x):
        idx = eye[side]
        if len(idx) == 0:
            continue
        y = rot_free[idx, 1]
        exp[idx, 1] -= closure * (y - y.mean())
    return exp.reshape(1, -1)


def _per_row(values: np.ndarray, like: np.ndarray) -> np.ndarray:
    """[B] values shaped to broadcast against `like` ([B] or [B, ...])."""
    return values.reshape(-1, *([1] * (like.ndim - 1)))


class MotionStitch:
    """(x_s_info, x_d_info) of frames -> (x_s [B,21,3], x_d [B,21,3]); one object per render, frames in order.

    `batch` takes B frames at once, vectorised over them; every frame's keypoints are the same bytes
    whether it comes alone or in a batch of any size (row-wise arithmetic only, and the stitching
    network, whose matrix products do depend on the batch size, runs on one row at a time).

    Options (defaults are Ditto's for the avatar kind):
      relative      drive relative to the first driving frame (True)
      drive_pose    take pose and translation from the motion (image: True, video: False)
      drive_eye     take the eye keypoints from the motion and fix the gaze (image: True, video: False)
      stitching     run the stitching network (True)
      controls      Controls for per-frame offsets, fade and blinks (None: no controls)
    """

    def __init__(self, stitch_net: torch.nn.Module, is_image: bool, *, relative: bool = True,
                 drive_pose: bool | None = None, drive_eye: bool | None = None, stitching: bool = True,
                 controls: Controls | None = None):
        self.stitch_net = stitch_net
        self.is_image = is_image
        self.relative = relative
        self.drive_pose = is_image if drive_pose is None else drive_pose
        self.drive_eye = is_image if drive_eye is None else drive_eye
        self.stitching = stitching
        self.controls = controls
        self.use_d_keys = ("exp", *POSE_KEYS, "t") if self.drive_pose else ("exp",)
        self.exp_mask = _mask(LIP_KP + EYE_KP) if self.drive_eye else _mask(LIP_KP)  # [1, 63]
        self.d0: dict | None = None
        self.frame = 0

    def _mix(self, s: dict, d: dict) -> dict:
        """Source info with the driven keys replaced (relatively) by the motion; pose still as bin logits."""
        if self.relative and self.d0 is None:
            self.d0 = {k: _np32(v)[:1].copy() for k, v in d.items()}
        out = {k: _np32(v) for k, v in s.items()}
        for k in self.use_d_keys:
            v = _np32(d[k])
            out[k] = out[k] + (v - self.d0[k]) if self.relative else v
        out["exp"] = out["exp"] * self.exp_mask + _np32(s["exp"]) * (1 - self.exp_mask)
        return out

    def _apply_controls(self, info: dict, src: dict, cs: list[FrameControl]) -> dict:
        """Scale, offset, blink and fade each frame's motion (pose in degrees), frame by frame's own control."""
        def col(values) -> np.ndarray:
            return np.array(values, dtype=np.float32)

        pose_scale = col([c.pose_scale for c in cs])
        for k in POSE_KEYS:
            info[k] = src[k] + pose_scale * (info[k] - src[k]) + col([getattr(c, k) for c in cs])
        info["exp"] = src["exp"] + col([c.exp_scale for c in cs])[:, None] * (info["exp"] - src["exp"])
        for i, c in enumerate(cs):                      # only the frames that have them: no -0.0 + 0.0 elsewhere
            if c.exp_offset is not None:
                info["exp"][i] = info["exp"][i] + c.exp_offset
            if c.eye_closure > 0:
                info["exp"][i] = _close_eyes({k: v[i:i + 1] for k, v in info.items()}, c.eye_closure)[0]
        fading = np.array([c.fade < 1 for c in cs])
        if fading.any():
            keep, mix = col([c.fade for c in cs]), col([1 - c.fade for c in cs])
            for k in ("exp", "t", "scale", *POSE_KEYS):
                v = info[k].copy()
                v[fading] = info[k][fading] * _per_row(keep[fading], v) + src[k][fading] * _per_row(mix[fading], v)
                info[k] = v
        return info

    def _stitch(self, x_s: np.ndarray, x_d: np.ndarray) -> np.ndarray:
        """The stitching network on each frame alone (its matrix products would round otherwise by batch size)."""
        p = next(self.stitch_net.parameters())
        out = np.empty_like(x_d)
        with torch.no_grad():
            for i in range(x_d.shape[0]):
                out[i] = self.stitch_net(torch.from_numpy(x_s[i:i + 1]).to(p.device, p.dtype),
                                         torch.from_numpy(x_d[i:i + 1]).to(p.device, p.dtype)).float().cpu().numpy()
        return out  # [B, 21, 3]

    def _driven(self, s: dict, d: dict) -> dict:
        """The frames' motion mixed into the source, pose in degrees [B]."""
        info = self._mix(s, d)
        for k in POSE_KEYS:
            info[k] = pose_degrees(info[k])   # bin logits -> degrees [B]
        return info

    def batch(self, s: dict, d: dict, d_next: dict | None = None,
              w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Keypoints for the next B frames: x_s [B,21,3] from the sources, x_d [B,21,3] driven and stitched.

        s, d (and d_next) hold [B, ...] rows (source infos, motion infos). A frame between two motion frames
        (another output rate than the motion's) has weight w > 0: its motion and the next one's (`d_next`)
        are both mixed into the source and blended with pose in degrees, expression, translation and scale
        linear in time.
        """
        info = self._driven(s, d)
        n = info["exp"].shape[0]
        if d_next is not None and w is not None:
            w32 = np.asarray(w, dtype=np.float32).reshape(-1)
            rows = np.flatnonzero(w32 > 0)
            if rows.size:
                after = self._driven(s, d_next)
                for k in after:
                    v = info[k].copy()
                    v[rows] = v[rows] + _per_row(w32[rows], v) * (after[k][rows] - v[rows])
                    info[k] = v
        src = {k: _np32(v) for k, v in s.items()}
        for k in POSE_KEYS:
            src[k] = pose_degrees(src[k])
        if self.controls is not None:
            info = self._apply_controls(info, src, [self.controls.at(self.frame + i) for i in range(n)])
        if self.drive_eye:
            info["exp"] = _fix_gaze(info["exp"], info["yaw"] - src["yaw"], info["pitch"] - src["pitch"])
        x_s = transform_keypoints(s)
        x_d = transform_keypoints(info)
        if self.stitching:
            x_d = self._stitch(x_s, x_d)
        self.frame += n
        return x_s, x_d

    def __call__(self, x_s_info: dict, x_d_info: dict, x_d_next: dict | None = None,
                 w: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """Keypoints for one frame (rows [1, ...] in, [1,21,3] out): `batch` with B = 1."""
        return self.batch(x_s_info, x_d_info, x_d_next if w > 0 else None, np.array([w]))
