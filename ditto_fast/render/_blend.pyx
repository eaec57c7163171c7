# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Blend a warped face crop into a region of a frame in place: frame = mask*crop + (1-mask)*frame, rounded."""

from libc.stdint cimport uint8_t


def blend_roi_f32(const uint8_t[:, :, ::1] crop, const float[:, ::1] mask, uint8_t[:, :, ::1] frame,
                  Py_ssize_t y0, Py_ssize_t x0) -> None:
    """frame[y0+y, x0+x] <- round(m*crop + (1-m)*frame) for a float mask in [0,1]; crop [h,w,3], mask [h,w]."""
    cdef Py_ssize_t h = crop.shape[0], w = crop.shape[1], y, x, c
    cdef float m, v
    if mask.shape[0] != h or mask.shape[1] != w:
        raise ValueError("crop and mask regions differ in size")
    if y0 < 0 or x0 < 0 or y0 + h > frame.shape[0] or x0 + w > frame.shape[1]:
        raise ValueError("region lies outside the frame")
    if frame.shape[2] != 3 or crop.shape[2] != 3:
        raise ValueError("crop and frame must have 3 channels")
    with nogil:
        for y in range(h):
            for x in range(w):
                m = mask[y, x]
                if m <= 0.0:
                    continue
                if m >= 1.0:
                    frame[y0 + y, x0 + x, 0] = crop[y, x, 0]
                    frame[y0 + y, x0 + x, 1] = crop[y, x, 1]
                    frame[y0 + y, x0 + x, 2] = crop[y, x, 2]
                    continue
                for c in range(3):
                    v = frame[y0 + y, x0 + x, c] + m * (<float>crop[y, x, c] - <float>frame[y0 + y, x0 + x, c]) + 0.5
                    if v >= 255.0:
                        frame[y0 + y, x0 + x, c] = 255
                    elif v <= 0.0:
                        frame[y0 + y, x0 + x, c] = 0
                    else:
                        frame[y0 + y, x0 + x, c] = <uint8_t>v


def blend_roi_u8(const uint8_t[:, :, ::1] crop, const uint8_t[:, ::1] mask, uint8_t[:, :, ::1] frame,
                  Py_ssize_t y0, Py_ssize_t x0) -> None:
    """frame[y0+y, x0+x] <- round((m*crop + (255-m)*frame) / 255) for a uint8 mask (255 = crop)."""
    cdef Py_ssize_t h = crop.shape[0], w = crop.shape[1], y, x, c
    cdef unsigned int m, v
    if mask.shape[0] != h or mask.shape[1] != w:
        raise ValueError("crop and mask regions differ in size")
    if y0 < 0 or x0 < 0 or y0 + h > frame.shape[0] or x0 + w > frame.shape[1]:
        raise ValueError("region lies outside the frame")
    if frame.shape[2] != 3 or crop.shape[2] != 3:
        raise ValueError("crop and frame must have 3 channels")
    with nogil:
        for y in range(h):
            for x in range(w):
                m = mask[y, x]
                if m == 0:
                    continue
                if m == 255:
                    frame[y0 + y, x0 + x, 0] = crop[y, x, 0]
                    frame[y0 + y, x0 + x, 1] = crop[y, x, 1]
                    frame[y0 + y, x0 + x, 2] = crop[y, x, 2]
                    continue
                for c in range(3):
                    v = m * crop[y, x, c] + (255 - m) * frame[y0 + y, x0 + x, c] + 127
                    frame[y0 + y, x0 + x, c] = <uint8_t>(v // 255)
