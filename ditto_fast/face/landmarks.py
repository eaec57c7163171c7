"""Mediapipe face-mesh landmarks (478 points with iris) on every frame: detect first, track after.

The mesh run on a whole 1080p frame misses medium and small faces, so the mesh only ever sees a
square crop around the face, about twice the face's size and resized to 256 px, and its points
are mapped back to frame pixels. The face is found with mediapipe's full-range detector run on the
whole frame and on overlapping tiles (small faces are too few pixels once a 1080p frame is shrunk to
the detector's 192x192 input); after that each frame's crop comes from the previous frame's
landmarks, and the detector runs again only when the mesh loses the face. Every step is
deterministic: the mesh runs in static-image mode, so a frame's result depends only on the frame and
on the previous landmarks. (mediapipe's tracking mode would save about a third of the mesh's time,
but its landmarks drift: on a static shot the crop grew 0.7% over 20 frames.)
"""

from __future__ import annotations

import os
import sys
import warnings
from contextlib import contextmanager
from types import ModuleType

import cv2
import numpy as np

from ditto_fast.core.errors import NoFaceError, UsageError
from ditto_fast.media.yuv import YuvFrame, frame_region, frame_rgb as whole_rgb
from ditto_fast.face.crop import face_size

CROP_FACTOR = 2.0          # mesh crop side / face size
MESH_PX = 256              # the mesh crop is resized to this side (the mesh model itself sees 192 px)
TILE_OVERLAP = 0.35        # fraction of a detector tile shared with its neighbour
TILE_PER_FACE = 10         # finest detector tile side / smallest face


REGISTER_INSTALL = ("pip install 'ditto-fast[register]' (mediapipe 0.10.21, numpy<2, Python 3.10-3.12), or use "
                    "./scripts/setup/setup_env.sh, which installs everything")


def import_mediapipe() -> ModuleType:
    """The mediapipe module; UsageError (exit 2) naming the install when this is a render-only install."""
    try:
        import mediapipe as mp  # heavy import, only when registering
    except ImportError as e:
        why = "is not installed" if getattr(e, "name", None) == "mediapipe" else f"does not import ({e})"
        raise UsageError(f"register needs mediapipe, which {why} (a render-only install): "
                         f"{REGISTER_INSTALL}") from None
    if not hasattr(mp, "solutions"):
        raise UsageError(f"register needs mediapipe 0.10.21 (installed: {getattr(mp, '__version__', '?')}, "
                         f"whose wheel lacks the face-mesh models): {REGISTER_INSTALL}")
    return mp


FACE_WORDS = ("largest", "left", "right")    # which face to take when several are found; or N, counted from the left


class MultipleFacesWarning(UserWarning):
    """More than one face was found; the one `face` picks (by default the largest) is used."""


def box_text(b: np.ndarray) -> str:
    """A face box as `x0,y0-x1,y1` in whole pixels."""
    return "{:.0f},{:.0f}-{:.0f},{:.0f}".format(*b)


def _face_candidates(boxes: list[np.ndarray], face: str | int) -> list[np.ndarray]:
    """The boxes (largest first) to try, in order: every box for "largest" (the next when the mesh fails on one),
    only the chosen one for left, right or N (1 = the leftmost); none when N is more than the faces found."""
    if face == "largest":
        return boxes
    by_x = sorted(boxes, key=lambda b: b[0] + b[2])
    if face == "left":
        return by_x[:1]
    if face == "right":
        return by_x[-1:]
    return by_x[face - 1:face]


def choice_text(index: int, by_x: list[np.ndarray], taken: np.ndarray, why: str) -> str:
    """What a detection among several faces did: "frame 0: 2 faces found (boxes ...); took face 2 ... (why)"."""
    n = next(i for i, b in enumerate(by_x) if b is taken) + 1
    return (f"frame {index}: {len(by_x)} faces found (boxes x0,y0-x1,y1 from the left: "
            f"{'; '.join(box_text(b) for b in by_x)}); took face {n} ({box_text(taken)}), {why}")


def _face_label(face: str | int) -> str:
    return f"the {face}most face" if face in ("left", "right") else \
        "the largest face" if face == "largest" else f"face {face} from the left"


def _square_crop(frame: np.ndarray | YuvFrame, cx: float, cy: float,
                 side: float) -> tuple[np.ndarray, float, float, float]:
    """(crop [R, R, 3], x0, y0, px per crop px): a square around (cx, cy), black outside the frame."""
    h, w = frame.shape[:2]
    c = max(int(round(side)), 16)
    x0, y0 = int(round(cx - c / 2)), int(round(cy - c / 2))
    out = np.zeros((c, c, 3), dtype=np.uint8)
    ax, ay, bx, by = max(x0, 0), max(y0, 0), min(x0 + c, w), min(y0 + c, h)
    if bx > ax and by > ay:
        out[ay - y0:by - y0, ax - x0:bx - x0] = frame_region(frame, ax, ay, bx, by)
    while out.shape[0] >= 2 * MESH_PX:    # halve with a Gaussian first, so bilinear does not alias
        out = cv2.pyrDown(out)
    if out.shape[0] != MESH_PX:
        out = cv2.resize(out, (MESH_PX, MESH_PX), interpolation=cv2.INTER_LINEAR)
    return out, float(x0), float(y0), c / MESH_PX


def _tiles(h: int, w: int, finest: int) -> list[tuple[int, int, int, int]]:
    """Detector windows (x0, y0, x1, y1): the whole frame, then overlapping tiles halving down to `finest`."""
    windows = [(0, 0, w, h)]
    side = max(h, w)
    while side > finest:
        side = max(finest, side // 2)
        tw, th = min(side, w), min(side, h)
        for y0 in _starts(h, th):
            for x0 in _starts(w, tw):
                windows.append((x0, y0, x0 + tw, y0 + th))
    return windows


def _starts(length: int, tile: int) -> list[int]:
    """Evenly spread tile starts covering [0, length) with at least TILE_OVERLAP overlap."""
    if tile >= length:
        return [0]
    n = int(np.ceil((length - tile) / (tile * (1 - TILE_OVERLAP)))) + 1
    return [int(round(v)) for v in np.linspace(0, length - tile, n)]


def _merge_boxes(boxes: list[np.ndarray]) -> list[np.ndarray]:
    """Boxes (x0, y0, x1, y1) largest first, dropping any mostly inside a larger one kept already."""
    boxes = sorted(boxes, key=lambda b: -(b[2] - b[0]) * (b[3] - b[1]))
    kept: list[np.ndarray] = []
    for b in boxes:
        area = (b[2] - b[0]) * (b[3] - b[1])
        inside = False
        for k in kept:
            iw = min(b[2], k[2]) - max(b[0], k[0])
            ih = min(b[3], k[3]) - max(b[1], k[1])
            if iw > 0 and ih > 0 and iw * ih > 0.4 * area:
                inside = True
                break
        if not inside:
            kept.append(b)
    return kept


@contextmanager
def _native_stderr_silenced():
    """Point file descriptor 2 at /dev/null for the duration (native libraries' logging)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _no_face(message: str, index: int) -> NoFaceError:
    """NoFaceError carrying the frame index as `.frame_index`."""
    err = NoFaceError(message)
    err.frame_index = index
    return err


class FaceTracker:
    """Landmarks [478, 3] float32 in frame pixels (x, y, and z scaled like x) for consecutive frames.

    Call it on frames in order (`tracker(frame, index)`); `reset()` before an unrelated frame.
    When detection finds several faces (boxes the face mesh finds landmarks on, at least min_face_px across: a
    badge on a suit is none) it takes the one `face` picks (largest, left, right or N, counted
    from the left from 1), issues a MultipleFacesWarning and records the index in `multiple_faces_frames`
    and (index, boxes left to right, box taken, why) in `face_choices` (detection runs on the first frame and
    whenever tracking loses the face). A missing or too small face raises NoFaceError with `.frame_index`.
    """

    def __init__(self, min_face_px: int = 64, source: str | None = None, face: str | int = "largest") -> None:
        if face not in FACE_WORDS and not (isinstance(face, int) and not isinstance(face, bool) and face >= 1):
            raise ValueError(f"face must be one of {', '.join(FACE_WORDS)} or a number from 1, got {face!r}")
        mp = import_mediapipe()
        self.min_face_px = int(min_face_px)
        self.source = source
        self.face = face
        self.multiple_faces_frames: list[int] = []
        self.face_choices: list[tuple[int, list[np.ndarray], np.ndarray, str]] = []
        with _native_stderr_silenced():   # mediapipe's C++ start-up chatter, not for the user
            self._detector = mp.solutions.face_detection.FaceDetection(model_selection=1,
                                                                       min_detection_confidence=0.5)
            self._mesh = mp.solutions.face_mesh.FaceMesh(
                static_image_mode=True, max_num_faces=1, refine_landmarks=True, min_detection_confidence=0.5,
            )
            blank = np.zeros((256, 256, 3), np.uint8)
            self._detector.process(blank)      # graphs start (and log) on their first frame
            self._mesh.process(blank)
        self._quiet_calls = 2
        self._last: np.ndarray | None = None  # previous frame's landmarks [478, 3]

    # -- life cycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Release the mediapipe graphs."""
        for graph in (self._detector, self._mesh):
            if graph is not None:
                graph.close()
        self._detector = self._mesh = None

    def __enter__(self) -> "FaceTracker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def reset(self) -> None:
        """Forget the previous frame: the next call detects afresh."""
        self._last = None

    # -- per frame ----------------------------------------------------------------------------
    def __call__(self, frame_rgb: np.ndarray | YuvFrame, index: int) -> np.ndarray:
        """Landmarks [478, 3] (pixels) of the largest face in frame `index` (RGB uint8 [H, W, 3] or a
        YuvFrame); NoFaceError if none."""
        if self._quiet_calls > 0:      # the mesh logs once more when it first projects a face
            self._quiet_calls -= 1
            with _native_stderr_silenced():
                return self._track(frame_rgb, index)
        return self._track(frame_rgb, index)

    def _track(self, frame_rgb: np.ndarray | YuvFrame, index: int) -> np.ndarray:
        """Landmarks [478, 3] float32 in frame pixels for frame `index`."""
        if self._mesh is None:
            raise RuntimeError("FaceTracker is closed")
        frame = frame_rgb
        if not isinstance(frame, YuvFrame):
            frame = np.ascontiguousarray(frame)
            if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
                raise ValueError(f"frame must be uint8 [H, W, 3], got {frame.dtype} {frame.shape}")
        lmk = None
        if self._last is not None:
            lmk = self._mesh_around_landmarks(frame, self._last)
        if lmk is None:
            lmk = self._detect(frame, index)
        size = face_size(lmk)
        if size < self.min_face_px:
            self._last = None
            raise _no_face(
                f"{self._where()}frame {index}: the face is only {size:.0f} px across, below the "
                f"{self.min_face_px} px minimum; use a source where the face is larger", index,
            )
        self._last = lmk
        return lmk

    def _where(self) -> str:
        return f"{self.source}: " if self.source else ""

    def _mesh_in(self, frame: np.ndarray | YuvFrame, cx: float, cy: float, side: float) -> np.ndarray | None:
        """Mesh on a square crop around (cx, cy); landmarks [478, 3] in frame pixels or None."""
        crop, x0, y0, k = _square_crop(frame, cx, cy, side)
        res = self._mesh.process(crop)
        if not res.multi_face_landmarks:
            return None
        r = crop.shape[0]
        pts = np.array([(p.x, p.y, p.z) for p in res.multi_face_landmarks[0].landmark], dtype=np.float64)
        pts *= r * k                      # normalised crop units -> frame pixels (z like x)
        pts[:, 0] += x0
        pts[:, 1] += y0
        return pts.astype(np.float32)     # [478, 3]

    def _mesh_around_landmarks(self, frame: np.ndarray | YuvFrame, lmk: np.ndarray) -> np.ndarray | None:
        lo, hi = lmk[:, :2].min(0), lmk[:, :2].max(0)
        c = (lo + hi) / 2
        return self._mesh_in(frame, float(c[0]), float(c[1]), CROP_FACTOR * float((hi - lo).max()))

    def _detect_boxes(self, frame: np.ndarray | YuvFrame) -> list[np.ndarray]:
        """Face boxes (x0, y0, x1, y1) in frame pixels, largest first, from the whole frame and tiles."""
        frame = whole_rgb(frame)
        h, w = frame.shape[:2]
        boxes: list[np.ndarray] = []
        for x0, y0, x1, y1 in _tiles(h, w, TILE_PER_FACE * self.min_face_px):
            tile = np.ascontiguousarray(frame[y0:y1, x0:x1])
            res = self._detector.process(tile)
            tw, th = x1 - x0, y1 - y0
            for det in res.detections or []:
                rb = det.location_data.relative_bounding_box
                b = np.array([rb.xmin * tw, rb.ymin * th, (rb.xmin + rb.width) * tw, (rb.ymin + rb.height) * th])
                # a face cut by an inner tile edge is whole in a neighbouring tile or the coarser level
                m = 2.0
                if (x0 > 0 and b[0] < m) or (y0 > 0 and b[1] < m) or \
                        (x1 < w and b[2] > tw - m) or (y1 < h and b[3] > th - m):
                    continue
                boxes.append(b + np.array([x0, y0, x0, y0]))
        return _merge_boxes(boxes)

    def _faces(self, frame: np.ndarray | YuvFrame,
               boxes: list[np.ndarray]) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray | None]:
        """(box, landmarks [478, 3]) of each detected box (largest first) that is a face as the one taken must be:
        the face mesh finds landmarks on it and they span at least min_face_px (a badge on a suit is none); and the
        landmarks of the largest box that fails only the size (None if none), for the message that names it."""
        faces, small = [], None
        for b in boxes:
            cx, cy = (b[0] + b[2]) / 2, (b[1] + b[3]) / 2
            lmk = self._mesh_in(frame, cx, cy, CROP_FACTOR * max(b[2] - b[0], b[3] - b[1]))
            if lmk is not None and face_size(lmk) >= self.min_face_px:
                faces.append((b, lmk))
            elif lmk is not None and small is None:
                small = lmk
        return faces, small

    def _detect(self, frame: np.ndarray | YuvFrame, index: int) -> np.ndarray:
        """Landmarks of the detected face `face` picks among those that pass the face bar; NoFaceError if none."""
        boxes = self._detect_boxes(frame)
        faces, small = self._faces(frame, boxes)
        if len(faces) > 1:
            self.multiple_faces_frames.append(index)
        found = [b for b, _ in faces]
        for b in _face_candidates(found, self.face):
            lmk = next(m for k, m in faces if k is b)
            if len(faces) > 1:
                by_x = sorted(found, key=lambda k: k[0] + k[2])
                why = f"as --face {self.face} asked" if isinstance(self.face, int) else \
                    f"the {self.face}most" if self.face != "largest" else \
                    "the largest" if b is boxes[0] else "the largest the face mesh finds landmarks on"
                self.face_choices.append((index, by_x, b, why))
                warnings.warn(f"{self._where()}{choice_text(index, by_x, b, why)}", MultipleFacesWarning,
                              stacklevel=3)
            return lmk
        if small is not None and not found:
            return small                # too small: _track refuses it, naming its size
        self._last = None
        if found and self.face != "largest":
            raise _no_face(f"{self._where()}frame {index}: --face {self.face} asks for {_face_label(self.face)}: "
                           f"only {len(found)} face{'s' if len(found) > 1 else ''} found; choose another with "
                           "--face largest|left|right|N", index)
        raise _no_face(
            f"{self._where()}no face found in frame {index}; every frame needs a clearly visible face "
            f"at least {self.min_face_px} px across", index,
        )
