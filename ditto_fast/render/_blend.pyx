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


def blend_feathered(const uint8_t[:, :, ::1] crop, const float[:, ::1] mask, const double[::1] inv,
                    Py_ssize_t inner_lo, Py_ssize_t inner_hi, uint8_t[:, :, ::1] frame,
                    Py_ssize_t y0, Py_ssize_t x0) -> None:
    """Blend a warped crop [h,w,3] into frame[y0:y0+h, x0:x0+w], sampling the unwarped mask [S,S] bilinearly.

    inv (2x3, row-major) maps a region pixel (x, y) to mask coordinates; outside the mask counts as 0,
    and mask[inner_lo..inner_hi, inner_lo..inner_hi] must be 1 (those pixels are copied, not blended).
    Replaces a separate warp of the mask: only the feathered band is interpolated.
    """
    cdef Py_ssize_t h = crop.shape[0], w = crop.shape[1], sh = mask.shape[0], sw = mask.shape[1]
    cdef Py_ssize_t y, x, c, ix, iy
    cdef double a0 = inv[0], a1 = inv[1], a2 = inv[2], b0 = inv[3], b1 = inv[4], b2 = inv[5]
    cdef double rx, ry, sx, sy, fx, fy
    cdef float m, v, m00, m01, m10, m11
    if inv.shape[0] != 6:
        raise ValueError("inv must hold 6 values (a 2x3 affine matrix)")
    if y0 < 0 or x0 < 0 or y0 + h > frame.shape[0] or x0 + w > frame.shape[1]:
        raise ValueError("region lies outside the frame")
    if frame.shape[2] != 3 or crop.shape[2] != 3:
        raise ValueError("crop and frame must have 3 channels")
    with nogil:
        for y in range(h):
            rx = a1 * y + a2
            ry = b1 * y + b2
            for x in range(w):
                sx = a0 * x + rx
                sy = b0 * x + ry
                if sx <= -1.0 or sy <= -1.0 or sx >= sw or sy >= sh:
                    continue
                if inner_lo <= sx <= inner_hi and inner_lo <= sy <= inner_hi:
                    frame[y0 + y, x0 + x, 0] = crop[y, x, 0]
                    frame[y0 + y, x0 + x, 1] = crop[y, x, 1]
                    frame[y0 + y, x0 + x, 2] = crop[y, x, 2]
                    continue
                ix = <Py_ssize_t>(sx + 1.0) - 1     # floor for sx > -1
                iy = <Py_ssize_t>(sy + 1.0) - 1
                fx = sx - ix
                fy = sy - iy
                m00 = mask[iy, ix] if iy >= 0 and ix >= 0 else 0.0
                m01 = mask[iy, ix + 1] if iy >= 0 and ix + 1 < sw else 0.0
                m10 = mask[iy + 1, ix] if iy + 1 < sh and ix >= 0 else 0.0
                m11 = mask[iy + 1, ix + 1] if iy + 1 < sh and ix + 1 < sw else 0.0
                m = <float>((1.0 - fy) * ((1.0 - fx) * m00 + fx * m01) + fy * ((1.0 - fx) * m10 + fx * m11))
                if m <= 0.0:
                    continue
                if m >= 1.0:
                    m = 1.0
                for c in range(3):
                    v = frame[y0 + y, x0 + x, c] + m * (<float>crop[y, x, c] - <float>frame[y0 + y, x0 + x, c]) + 0.5
                    if v >= 255.0:
                        frame[y0 + y, x0 + x, c] = 255
                    elif v <= 0.0:
                        frame[y0 + y, x0 + x, c] = 0
                    else:
                        frame[y0 + y, x0 + x, c] = <uint8_t>v
