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


def _fix_gaze(exp: np.ndarray, d_yaw: float, d_pitch: float) -> np.ndarray:
    """Move the eye-centre keypoints against the head turn so the eyes keep looking at the camera."""
    dx, dy = d_yaw * GAZE_X_RATIO, d_pitch * GAZE_Y_RATIO
    exp = exp.copy()
    (ax, ay), (bx, by) = ((3 * k, 3 * k + 1) for k in GAZE_KP)
    exp[0, ax] += dx * (0.0007 if dx > 0 else 0.001)
    exp[0, bx] += dx * (0.001 if dx > 0 else 0.0007)
    exp[0, ay] -= dy * 0.001
    exp[0, by] -= dy * 0.001
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


class MotionStitch:
    """Per-frame (x_s_info, x_d_info) -> (x_s [1,21,3], x_d [1,21,3]); one object per render, frames in order.

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
            self.d0 = {k: _np32(v).copy() for k, v in d.items()}
        out = {k: _np32(v) for k, v in s.items()}
        for k in self.use_d_keys:
            v = _np32(d[k])
            out[k] = out[k] + (v - self.d0[k]) if self.relative else v
        out["exp"] = out["exp"] * self.exp_mask + _np32(s["exp"]) * (1 - self.exp_mask)
        return out

    def _apply_controls(self, info: dict, src: dict, c: FrameControl) -> dict:
        """Scale, offset, blink and fade the frame's motion (pose in degrees)."""
        for k in POSE_KEYS:
            info[k] = src[k] + c.pose_scale * (info[k] - src[k]) + getattr(c, k)
        info["exp"] = src["exp"] + c.exp_scale * (info["exp"] - src["exp"])
        if c.exp_offset is not None:
            info["exp"] = info["exp"] + c.exp_offset.reshape(1, -1)
        if c.eye_closure > 0:
            info["exp"] = _close_eyes(info, c.eye_closure)
        if c.fade < 1:
            for k in ("exp", "t", "scale", *POSE_KEYS):
                info[k] = info[k] * c.fade + src[k] * (1 - c.fade)
        return info

    def _stitch(self, x_s: np.ndarray, x_d: np.ndarray) -> np.ndarray:
        p = next(self.stitch_net.parameters())
        with torch.no_grad():
            out = self.stitch_net(torch.from_numpy(x_s).to(p.device, p.dtype),
                                  torch.from_numpy(x_d).to(p.device, p.dtype))
        return out.float().cpu().numpy()  # [1, 21, 3]

    def _driven(self, x_s_info: dict, x_d_info: dict) -> dict:
        """The frame's motion mixed into the source, pose in degrees [1]."""
        info = self._mix(x_s_info, x_d_info)
        for k in POSE_KEYS:
            info[k] = pose_degrees(info[k])   # bin logits -> degrees [1]
        return info

    def __call__(self, x_s_info: dict, x_d_info: dict, x_d_next: dict | None = None,
                 w: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """Keypoints for one frame: x_s [1,21,3] from the source, x_d [1,21,3] driven and stitched.

        A frame between two motion frames (another output rate than the motion's) gives the next one as
        `x_d_next` and its weight `w`: both are mixed into the source and blended with pose in degrees,
        expression, translation and scale linear in time.
        """
        info = self._driven(x_s_info, x_d_info)
        if x_d_next is not None and w > 0:
            after = self._driven(x_s_info, x_d_next)
            info = {k: (v + np.float32(w) * (after[k] - v)) if k in after else v for k, v in info.items()}
        src = {k: _np32(v) for k, v in x_s_info.items()}
        for k in POSE_KEYS:
            src[k] = pose_degrees(src[k])
        if self.controls is not None:
            info = self._apply_controls(info, src, self.controls.at(self.frame))
        if self.drive_eye:
            info["exp"] = _fix_gaze(info["exp"], float(info["yaw"][0] - src["yaw"][0]),
                                    float(info["pitch"][0] - src["pitch"][0]))
        x_s = transform_keypoints(x_s_info)
        x_d = transform_keypoints(info)
        if self.stitching:
            x_d = self._stitch(x_s, x_d)
        self.frame += 1
        return x_s, x_d
