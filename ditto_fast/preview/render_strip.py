"""`render --preview OUT.png` (and batch's --previews): one picture of a finished render.

A strip of thumbnails of the output at evenly spaced times, face close-ups under them, then on one
time axis the audio waveform, with `--emotion auto` the emotion read from the speech (a stacked band per class),
and the generated lip opening over the speech's loudness, so lip activity can be checked against the speech at a
glance.
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np

from ditto_fast.audio.decode import load_audio
from ditto_fast.face.crop import params_to_matrix, warp_crop
from ditto_fast.media.rates import SPEECH_SAMPLE_RATE
from ditto_fast.preview.avatar_sheet import crop_corners
from ditto_fast.preview.canvas import (BLUE, GREY, INK, MARGIN, RED, WIDTH, Box, TimePlot, evenly_spaced, nice_step, page, paste,
                     text, write_png)
from ditto_fast.motion.emotions import EMOTIONS
from ditto_fast.preview.video_frames import video_frames

THUMBS = 6
HEADER = 56
LABEL = 22
WAVE_H, MOUTH_H, AXIS_H, EMOTION_H = 130, 170, 38, 110
# BGR of each emotion class's band, in EMOTIONS' order
EMOTION_COLOURS = ((50, 50, 210), (60, 140, 100), (150, 70, 140), (40, 190, 240), (195, 195, 195), (190, 110, 40),
                   (190, 120, 240), (70, 100, 150))
LOUDNESS = (215, 215, 215)      # BGR of the speech loudness area


def face_square(M_c2o: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(cx, cy, side, 0) of a square around every crop of an avatar [N, 3, 3], as large as the frame allows."""
    corners = np.concatenate([crop_corners(m) for m in np.asarray(M_c2o).reshape(-1, 3, 3)])
    lo, hi = corners.min(0), corners.max(0)
    side = min(float((hi - lo).max()), float(min(size)))
    return np.array([*(lo + hi) / 2, side, 0.0])


def _loudness(audio: np.ndarray, frames: int, rate: Fraction) -> np.ndarray:
    """RMS [frames] of the 16 kHz audio over each output frame's time."""
    edges = np.round(np.arange(frames + 1) * SPEECH_SAMPLE_RATE / float(rate)).astype(np.int64)
    sq = np.concatenate([[0.0], np.cumsum(audio.astype(np.float64) ** 2)])
    a, b = np.minimum(edges[:-1], len(audio)), np.minimum(edges[1:], len(audio))
    return np.sqrt((sq[b] - sq[a]) / np.maximum(b - a, 1))


def _time_axis(plot: TimePlot, seconds: float) -> None:
    step = nice_step(seconds, 12)
    ticks = np.arange(0, seconds + step / 2, step)
    plot.x_axis(ticks, [f"{t:g}" for t in ticks], "seconds")


def _waveform(plot: TimePlot, audio: np.ndarray, peak: float) -> None:
    """Min-max envelope of the audio, one vertical line per page column."""
    cols = plot.right - plot.left
    if len(audio) == 0 or cols <= 0:
        return
    edges = np.linspace(0, len(audio), cols + 1).astype(np.int64)
    for c in range(cols):
        seg = audio[edges[c]:max(edges[c + 1], edges[c] + 1)]
        lo, hi = plot.py(float(seg.min()) / peak), plot.py(float(seg.max()) / peak)
        cv2.line(plot.img, (plot.left + c, int(lo)), (plot.left + c, int(hi)), BLUE, 1)


def _emotion_bands(plot: TimePlot, t_frames: np.ndarray, probs: np.ndarray) -> None:
    """Each class's probability stacked on the ones before it (EMOTIONS' order), one filled band per class."""
    probs = np.clip(np.asarray(probs, np.float64)[:len(t_frames)], 0, None)
    if len(probs) == 0:
        return
    cum = np.concatenate([np.zeros((len(probs), 1)), np.cumsum(probs / np.maximum(probs.sum(1, keepdims=True), 1e-9),
                                                               axis=1)], axis=1)   # [N, 9]
    xs = plot.px(t_frames[:len(probs)])
    if len(xs) == 1:
        xs = np.array([xs[0], plot.right - 1])
        cum = np.repeat(cum, 2, axis=0)
    for c, colour in enumerate(EMOTION_COLOURS):
        upper = np.stack([xs, plot.py(cum[:, c + 1])], -1)
        lower = np.stack([xs, plot.py(cum[:, c])], -1)[::-1]
        cv2.fillPoly(plot.img, [np.concatenate([upper, lower]).astype(np.int32).reshape(-1, 1, 2)], colour)


def render_strip(video: str | os.PathLike, audio: str | os.PathLike, frames: int, rate: Fraction, *,
                 mouth: np.ndarray | None = None, face: np.ndarray | None = None, title: str = "",
                 random_weights: bool = False, emotion: np.ndarray | None = None) -> np.ndarray:
    """The preview page of a finished render: BGR uint8 [H, 1600, 3].

    frames, rate: the output's frame count and rate; mouth: the generated lip opening per frame [frames];
    emotion: `--emotion auto`'s smoothed probabilities per frame [frames, 8] (a band under the waveform);
    face: (cx, cy, side, 0) of the face close-ups in frame pixels (see face_square), none when not given;
    random_weights: say in the header that the face is noise.
    """
    rate = Fraction(rate)
    shown = evenly_spaced(max(frames, 1), THUMBS)
    pictures = video_frames(video, shown, rate)
    h, w = pictures[0].shape[:2]
    cell_w = (WIDTH - (THUMBS + 1) * MARGIN) // THUMBS
    thumb_h = int(round(cell_w * h / w))
    close_h = cell_w if face is not None else 0
    y_plots = HEADER + LABEL + thumb_h + (8 + close_h if close_h else 0) + MARGIN
    emo_h = EMOTION_H + AXIS_H if emotion is not None else 0
    img = page(y_plots + WAVE_H + AXIS_H + emo_h + MOUTH_H + AXIS_H + MARGIN)
    seconds = max(frames, 1) / float(rate)
    text(img, title or f"render {Path(video).name}", MARGIN, 24, 0.65, INK, bold=True)
    text(img, f"{frames} frames at {rate} fps, {seconds:.2f} s; audio {Path(audio).name}; thumbnails at the "
              "grey marks" + ("; RANDOM WEIGHTS: the face is noise" if random_weights else ""), MARGIN, 46, 0.5)
    for j, (k, pic) in enumerate(zip(shown, pictures)):
        x = MARGIN + j * (cell_w + MARGIN)
        top = HEADER + LABEL
        text(img, f"frame {int(k)}  {int(k) / float(rate):.2f} s", x, top - 6, 0.45, INK, bold=True)
        paste(img, pic, Box(x, top, cell_w, thumb_h))
        if face is not None:
            close = warp_crop(pic, params_to_matrix(face, cell_w), cell_w)
            paste(img, close, Box(x, top + thumb_h + 8, cell_w, cell_w))

    audio_16k = load_audio(audio)
    peak = max(float(np.abs(audio_16k).max()) if len(audio_16k) else 0.0, 1e-6)
    t_frames = np.arange(frames) / float(rate)
    wave = TimePlot(img, Box(MARGIN, y_plots, WIDTH - 2 * MARGIN, WAVE_H), seconds, -1.0, 1.0,
                    "audio waveform (scaled to its peak)")
    lo_m, hi_m = (0.0, 1.0) if mouth is None or len(mouth) == 0 else (float(np.min(mouth)), float(np.max(mouth)))
    pad = max((hi_m - lo_m) * 0.1, 1e-6)
    plots = [wave]
    if emotion is not None:
        band = TimePlot(img, Box(MARGIN, y_plots + WAVE_H + AXIS_H, WIDTH - 2 * MARGIN, EMOTION_H), seconds, 0.0, 1.0,
                        "emotion read from the speech")
        _emotion_bands(band, t_frames, emotion)
        band.legend(list(zip(EMOTIONS, EMOTION_COLOURS)))
        plots.append(band)
    lips = TimePlot(img, Box(MARGIN, y_plots + WAVE_H + AXIS_H + emo_h, WIDTH - 2 * MARGIN, MOUTH_H), seconds,
                    lo_m - pad, hi_m + pad, "generated lip opening")
    loud = _loudness(audio_16k, frames, rate)
    if frames and loud.max() > 0:       # speech loudness behind the lips, scaled to the panel
        y = lips.py(lips.y_lo + loud / loud.max() * (lips.y_hi - lips.y_lo))
        xs = lips.px(t_frames)
        poly = np.concatenate([np.stack([xs, y], -1), [[xs[-1], lips.bottom - 1], [xs[0], lips.bottom - 1]]])
        cv2.fillPoly(img, [poly.astype(np.int32).reshape(-1, 1, 2)], LOUDNESS, cv2.LINE_AA)
    for plot in (*plots, lips):
        for k in shown:
            plot.vmark(int(k) / float(rate))
        _time_axis(plot, seconds)
    _waveform(wave, audio_16k, peak)
    if mouth is None:
        text(img, "lip opening not available for this output (it comes from the render itself)",
             lips.left + 12, (lips.top + lips.bottom) // 2, 0.5, GREY)
        lips.legend([("speech loudness", LOUDNESS)])
    else:
        m = np.asarray(mouth, np.float64)[:frames]
        lips.line(t_frames[:len(m)], m, RED)
        lips.legend([("lip opening (generated motion)", RED), ("speech loudness", LOUDNESS)])
    return img


def write_render_preview(path: str | os.PathLike, video: str | os.PathLike, audio: str | os.PathLike, frames: int,
                         rate: Fraction | str, *, mouth: np.ndarray | None = None, M_c2o: np.ndarray | None = None,
                         size: tuple[int, int] | None = None, title: str = "", random_weights: bool = False,
                         emotion: np.ndarray | None = None) -> Path:
    """Draw a finished render's preview and write it as a PNG at `path` (atomically); returns the path.

    M_c2o [N, 3, 3] and size (w, h): the avatar's crops and frame size, for the face close-ups; emotion [N, 8]: the
    auto emotion track's probabilities.
    """
    face = face_square(M_c2o, size) if M_c2o is not None and size is not None else None
    return write_png(render_strip(video, audio, frames, Fraction(rate), mouth=mouth, face=face, title=title,
                                  random_weights=random_weights, emotion=emotion), path)
