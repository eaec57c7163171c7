"""Synthetic anchor footage for tests and the demo: skimage's astronaut (a real face) on a studio-like
canvas, moved by a known similarity motion, optionally written as an H.264 MP4; and `write_plate`,
which encodes any frames as a video plate the way registration does.

The astronaut picture is 512x512 with a face about ASTRONAUT_FACE_PX across (brows to chin, temple
to temple, as ditto_fast.face.crop.face_size measures it); `Motion.scale` resizes the picture, so a
face of F px needs scale F / ASTRONAUT_FACE_PX (see `Motion.for_face`).
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import cv2
import numpy as np

ASTRONAUT_FACE_PX = 91.0     # face size in the 512x512 astronaut picture (measured with face_size)
# her lips in the 512x512 picture (mediapipe points 13/14 and corners 61/291, measured once): centre, width, roll
ASTRONAUT_MOUTH = (223.3, 147.0, 42.8, 1.2)


def astronaut() -> np.ndarray:
    """skimage's astronaut picture, RGB uint8 [512, 512, 3] (a fresh copy)."""
    return _astronaut().copy()


@lru_cache(maxsize=4)
def _astronaut(mouth: float = 0.0) -> np.ndarray:
    """The picture, her lips parted by `mouth` x the mouth's width when mouth > 0 (read-only use)."""
    from skimage.data import astronaut as load

    pic = np.ascontiguousarray(load())
    if mouth > 0:
        cx, cy, width, roll = ASTRONAUT_MOUTH
        axes = (int(round(0.42 * width)), max(1, int(round(mouth * width / 2))))
        centre = (int(round(cx)), int(round(cy + mouth * width * 0.25)))       # the jaw drops: open downwards
        lips = (int(round(0.5 * width)), axes[1] + int(round(0.09 * width)))
        cv2.ellipse(pic, centre, lips, roll, 0, 360, (196, 120, 115), -1, cv2.LINE_AA)          # lips
        cv2.ellipse(pic, centre, axes, roll, 0, 360, (45, 12, 18), -1, cv2.LINE_AA)             # dark mouth
        teeth = (axes[0] - 3, max(1, axes[1] // 4))
        cv2.ellipse(pic, (centre[0], centre[1] - axes[1] + teeth[1]), teeth, roll, 0, 360, (225, 222, 210), -1,
                    cv2.LINE_AA)                                                             # upper teeth
    return pic


def open_mouth_astronaut(mouth: float = 0.35) -> np.ndarray:
    """The astronaut with her mouth open, `mouth` x its width between the lips, RGB uint8 [512, 512, 3]."""
    return _astronaut(float(mouth)).copy()


@dataclass(frozen=True)
class Motion:
    """Where the astronaut picture lands in frame i: a similarity about the picture's centre.

    At frame i the picture's centre is at `center + velocity * i`, it is turned by
    `angle_deg + spin_deg * i` (positive = clockwise on screen) and resized by `scale * (1 + zoom * i)`.
    """

    center: tuple[float, float] = (960.0, 500.0)   # frame pixels
    scale: float = 1.0
    angle_deg: float = 0.0
    velocity: tuple[float, float] = (0.0, 0.0)     # px per frame
    spin_deg: float = 0.0                          # degrees per frame
    zoom: float = 0.0                              # relative scale change per frame

    @staticmethod
    def for_face(face_px: float, **kw) -> "Motion":
        """A Motion whose face is face_px across at frame 0."""
        return Motion(scale=face_px / ASTRONAUT_FACE_PX, **kw)

    def pose(self, i: int) -> tuple[float, float, float, float]:
        """(cx, cy, scale, angle in radians) of the picture at frame i."""
        return (self.center[0] + self.velocity[0] * i, self.center[1] + self.velocity[1] * i,
                self.scale * (1.0 + self.zoom * i), np.deg2rad(self.angle_deg + self.spin_deg * i))

    def matrix(self, i: int) -> np.ndarray:
        """3x3 map from astronaut-picture pixels to frame pixels at frame i."""
        cx, cy, s, a = self.pose(i)
        c, n = np.cos(a) * s, np.sin(a) * s
        half = 256.0
        return np.array([[c, -n, cx - (c - n) * half], [n, c, cy - (n + c) * half], [0.0, 0.0, 1.0]])


def background(size: tuple[int, int] = (1920, 1080)) -> np.ndarray:
    """A soft blue-grey studio gradient, RGB uint8 [H, W, 3] for size (W, H) (a fresh copy)."""
    return _background(tuple(size)).copy()


@lru_cache(maxsize=4)
def _background(size: tuple[int, int]) -> np.ndarray:
    w, h = size
    y = np.linspace(0.0, 1.0, h, dtype=np.float32)[:, None]
    x = np.linspace(0.0, 1.0, w, dtype=np.float32)[None, :]
    base = np.stack([60 + 40 * x + 0 * y, 70 + 30 * y + 0 * x, 100 + 40 * (1 - y) + 0 * x], -1)
    return np.clip(base, 0, 255).astype(np.uint8)


def astronaut_canvas(frame_index: int, motion: Motion | None = None, size: tuple[int, int] = (1920, 1080),
                     noise: float = 0.0, seed: int = 0, extra: tuple[Motion, ...] = (),
                     mouth: float = 0.0) -> np.ndarray:
    """Frame `frame_index` [H, W, 3] uint8: the astronaut placed by `motion` (and by each of `extra`,
    for more faces) on the studio background; `mouth` > 0 opens her mouth (see open_mouth_astronaut).

    `noise` > 0 adds Gaussian sensor noise of that std (0-255 units) over each picture's rectangle
    (where it moves landmarks; the plain background is left clean to save time), drawn from a
    generator seeded by (seed, frame_index), so a static scene still jitters from frame to frame.
    """
    w, h = size
    frame = background(size)
    pic = _astronaut(float(mouth))
    rng = np.random.default_rng([seed, frame_index])
    corners = np.array([[0, 0, 1], [512, 0, 1], [0, 512, 1], [512, 512, 1]], dtype=np.float64).T
    for m in (motion or Motion(),) + tuple(extra):
        M = m.matrix(frame_index)
        xy = (M @ corners)[:2]                                   # the picture's corners in the frame
        x0, y0 = np.maximum(np.floor(xy.min(1)).astype(int) - 1, 0)
        x1, y1 = np.minimum(np.ceil(xy.max(1)).astype(int) + 2, (w, h))
        if x1 <= x0 or y1 <= y0:
            continue
        T = M[:2] - np.array([[0, 0, x0], [0, 0, y0]])           # render only that rectangle
        warped = cv2.warpAffine(pic, T, (x1 - x0, y1 - y0), flags=cv2.INTER_LINEAR)
        mask = cv2.warpAffine(np.full(pic.shape[:2], 255, np.uint8), T, (x1 - x0, y1 - y0), flags=cv2.INTER_LINEAR)
        a = (mask.astype(np.float32) / 255.0)[..., None]
        region = frame[y0:y1, x0:x1]
        out = warped * a + region * (1.0 - a) + 0.5
        if noise > 0:
            out += rng.standard_normal(out.shape, dtype=np.float32) * np.float32(noise)
        frame[y0:y1, x0:x1] = np.clip(out, 0, 255).astype(np.uint8)
    return frame


def write_anchor_video(path: str | Path, n_frames: int, fps: float = 25, size: tuple[int, int] = (1920, 1080),
                       face_px: float | None = None, motion: Motion | None = None, noise: float = 0.0,
                       seed: int = 0, mouth: float | tuple[float, ...] = 0.0, bt709: bool = False) -> Path:
    """Write an H.264 MP4 of `n_frames` astronaut frames (see astronaut_canvas) and return its path.

    `mouth`: how far her mouth is open (0: closed, as in the picture), one value or one per frame.
    `bt709`: tag the stream BT.709 (HD broadcast material); untagged otherwise, decoded as BT.601.

    `face_px` sets the face size at frame 0 (it overrides motion.scale); the default motion is a
    gentle drift (0.5 px/frame right, 0.05 degree/frame) centred in the frame.
    """
    import imageio_ffmpeg

    w, h = size
    if motion is None:
        motion = Motion(center=(w / 2, h * 0.45), velocity=(0.5, 0.0), spin_deg=0.05)
    if face_px is not None:
        motion = replace(motion, scale=face_px / ASTRONAUT_FACE_PX)
    path = Path(path)
    writer = imageio_ffmpeg.write_frames(str(path), (w, h), fps=fps, codec="libx264", pix_fmt_out="yuv420p",
                                         quality=None, macro_block_size=2,
                                         output_params=["-crf", "18", *(["-vf", "scale=out_color_matrix=bt709",
                                                                         "-colorspace", "bt709"] if bt709 else [])])
    writer.send(None)
    try:
        for i in range(n_frames):
            opening = mouth[i] if isinstance(mouth, tuple) else mouth
            writer.send(astronaut_canvas(i, motion, size, noise=noise, seed=seed, mouth=opening))
    finally:
        writer.close()
    return path


def moving_body_frames(n: int, size: tuple[int, int] = (1280, 720), grain: float = 0.0, seed: int = 0
                       ) -> list[np.ndarray]:
    """n frames [H, W, 3] uint8: the astronaut's face in the upper half; below it, from 0.65 of the height down, a
    body of her suit and helmet (no face) moving 4 px a frame sideways and 1 px down: real motion far from the face,
    where the plate alone shows through a render. `grain` > 0 adds camera grain: Gaussian noise of that std (in
    levels) on every pixel's luma, new in every frame."""
    w, h = size
    suit = astronaut()[260:]                                                   # [252, 512, 3], below her chin
    tex = np.concatenate([suit, suit[:, ::-1], suit, suit[::-1]], 1)
    tex = np.concatenate([tex, tex[::-1]], 0)                                  # [504, 2048, 3], tiles seamlessly
    reps = (-(-h // tex.shape[0]), -(-w // tex.shape[1]))
    tex = np.tile(tex, (*reps, 1))
    top = int(h * 0.65)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        f = astronaut_canvas(i, Motion(center=(w * 0.5, h * 0.36), velocity=(0.3, 0.0), scale=0.9 * h / 720), (w, h))
        f[top:] = np.roll(tex, (i, 4 * i), (0, 1))[:h - top, :w]
        if grain > 0:
            f = np.clip(f + rng.normal(0.0, grain, (h, w, 1)) + 0.5, 0, 255).astype(np.uint8)
        out.append(f)
    return out


def write_camera_clip(path: str | Path, frames: list[np.ndarray], fps: float | str = 30, codec: str = "h264",
                      pix_fmt: str = "yuv420p", matrix: str | None = "bt709", keyint: int = 30,
                      bitrate: str = "20M") -> Path:
    """Encode RGB frames as a camera writes its files: H.264 High (or `codec` hevc) with CABAC and B-frames, a
    keyframe every `keyint` frames, at most `bitrate`, in `pix_fmt`; BT.709 pixels, tagged `matrix` (None:
    untagged, as many cameras and screen recorders leave HD)."""
    import imageio_ffmpeg

    h, w = frames[0].shape[:2]
    enc = {"h264": ["-c:v", "libx264", "-preset", "veryfast", "-bf", "2"],
           "hevc": ["-c:v", "libx265", "-preset", "ultrafast", "-x265-params", "log-level=error:bframes=2"]}[codec]
    tags = ["-colorspace", matrix, "-color_primaries", matrix, "-color_trc", matrix] if matrix else []
    untag = "" if matrix else ",setparams=colorspace=unknown"
    subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24",
                    "-s", f"{w}x{h}", "-r", str(fps), "-i", "pipe:0",
                    "-vf", f"scale=out_color_matrix=bt709:out_range=tv,format={pix_fmt}{untag}", *enc,
                    "-g", str(keyint), "-b:v", bitrate, "-maxrate", bitrate, "-bufsize", bitrate, *tags, str(path)],
                   input=b"".join(np.ascontiguousarray(f).tobytes() for f in frames), check=True)
    return Path(path)


def write_plate(frames: Iterable[np.ndarray], path: str | Path, fps: float | str = 25) -> int:
    """Encode RGB frames [H, W, 3] uint8 (even H, W) as a video plate with registration's encoder options
    (`fps` as ffmpeg takes it: 25, "30000/1001").

    Returns the frame count; on any error ffmpeg is stopped and nothing is left at `path`.
    """
    import imageio_ffmpeg

    from ditto_fast.avatar.plate import plate_encoder_args

    path = Path(path)
    proc: subprocess.Popen | None = None
    n = 0
    try:
        for frame in frames:
            if proc is None:
                h, w = frame.shape[:2]
                proc = subprocess.Popen(
                    [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error", "-y",
                     "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}", "-framerate", str(fps),
                     "-i", "pipe:0", *plate_encoder_args(), str(path)], stdin=subprocess.PIPE)
            proc.stdin.write(np.ascontiguousarray(frame, np.uint8).tobytes())
            n += 1
        if proc is None:
            raise ValueError("write_plate got no frames")
        proc.stdin.close()
        if proc.wait() != 0:
            raise RuntimeError(f"ffmpeg failed writing the plate {path}")
    except BaseException:
        if proc is not None:
            proc.kill()
            with contextlib.suppress(OSError):
                proc.stdin.close()
            proc.wait()
        path.unlink(missing_ok=True)
        raise
    return n


# six saturated 75 % patches (R, G, B, C, M, Y), left and right of the anchor: colour checks of a picture path
PATCHES = [(191, 0, 0), (0, 191, 0), (0, 0, 191), (0, 191, 191), (191, 0, 191), (191, 191, 0)]


def patch_boxes(size: tuple[int, int]) -> list[tuple[int, int, int, int]]:
    """(x0, y0, x1, y1) of the six patches in a picture of `size` (w, h)."""
    w, h = size
    s = h // 6
    return [(x, y, x + s, y + s) for x in (w // 32, w - w // 32 - s) for y in (h // 12, h // 2 - s // 2, h - h // 12 - s)]


def patched_frames(size: tuple[int, int], n: int) -> list[np.ndarray]:
    """The astronaut on the set with the six patches, n RGB frames of a gentle drift."""
    w, h = size
    motion = Motion(center=(w * 0.5, h * 0.47), velocity=(0.4, 0.0), spin_deg=0.0, scale=h / 1080 * 2.4)
    out = []
    for i in range(n):
        f = astronaut_canvas(i, motion, size)
        for (x0, y0, x1, y1), c in zip(patch_boxes(size), PATCHES):
            f[y0:y1, x0:x1] = c
        out.append(f)
    return out


def patch_error(frame: np.ndarray) -> tuple[float, float]:
    """Mean and max over the six patches of |measured - fed| (levels, patch interiors) in an RGB frame."""
    h, w = frame.shape[:2]
    errs = []
    for (x0, y0, x1, y1), c in zip(patch_boxes((w, h)), PATCHES):
        m = 8
        got = frame[y0 + m:y1 - m, x0 + m:x1 - m].reshape(-1, 3).mean(0)
        errs.append(np.abs(got - np.array(c, float)))
    e = np.stack(errs)
    return float(e.mean()), float(e.max())


# the test suite's anchor (tests/conftest.py's `anchor_video`, and the stack fixtures CI's second stack reads):
# 1.5 px/frame right, 0.5 px/frame down, 0.1 degree/frame
TEST_ANCHOR_MOTION = Motion(center=(900.0, 520.0), velocity=(1.5, 0.5), spin_deg=0.1)


def write_test_anchor(path: str | Path) -> Path:
    """The suite's 1 s 1920x1080 anchor tagged BT.709: the astronaut (face ~150 px) moving by TEST_ANCHOR_MOTION."""
    return write_anchor_video(path, 25, face_px=150, motion=TEST_ANCHOR_MOTION, bt709=True)
