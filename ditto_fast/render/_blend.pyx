# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Blend a warped face crop into a region of a planar frame in place: plane = mask*crop + (1-mask)*plane, rounded.
Planes of 8 bits (uint8) or of 10 in 16 (uint16)."""

from libc.math cimport ceil, floor
from libc.stdint cimport uint8_t, uint16_t
from libc.string cimport memcpy

ctypedef fused pixel_t:
    uint8_t
    uint16_t


cdef inline pixel_t _mix(pixel_t f, pixel_t c, float m) noexcept nogil:
    """round(f + m * (c - f)) for 0 <= m <= 1 (between f and c, so inside the type's range)."""
    cdef float v = f + m * (<float>c - <float>f) + 0.5
    if v <= 0.0:
        return 0
    return <pixel_t>v



cdef inline void _solve(double a, double r, double lo, double hi, double* xa, double* xb) noexcept nogil:
    """x-interval [xa, xb] where lo <= a*x + r <= hi (empty when xa > xb)."""
    if a > 1e-12:
        xa[0] = (lo - r) / a
        xb[0] = (hi - r) / a
    elif a < -1e-12:
        xa[0] = (hi - r) / a
        xb[0] = (lo - r) / a
    elif lo <= r <= hi:
        xa[0] = -1e18
        xb[0] = 1e18
    else:
        xa[0] = 1e18
        xb[0] = -1e18


cdef inline void _span(double a0, double rx, double b0, double ry, double lo, double hi, double eps,
                       Py_ssize_t w, Py_ssize_t* first, Py_ssize_t* last) noexcept nogil:
    """Integer x in [0, w) with lo+eps <= (a0*x+rx, b0*x+ry) <= hi-eps in both coordinates; first > last if none."""
    cdef double xa, xb, ya, yb
    _solve(a0, rx, lo + eps, hi - eps, &xa, &xb)
    _solve(b0, ry, lo + eps, hi - eps, &ya, &yb)
    if ya > xa:
        xa = ya
    if yb < xb:
        xb = yb
    if xa < 0.0:
        xa = 0.0
    if xb > w - 1.0:
        xb = w - 1.0
    if xa > xb:
        first[0] = 1
        last[0] = 0
        return
    first[0] = <Py_ssize_t>ceil(xa)
    last[0] = <Py_ssize_t>floor(xb)


cdef inline void _blend_band_planes(const pixel_t[:, :, ::1] src, const float[:, ::1] mask,
                                    pixel_t[:, :, ::1] planes, Py_ssize_t y, Py_ssize_t x,
                                    Py_ssize_t py0, Py_ssize_t px0, double sx, double sy) noexcept nogil:
    """Bilinear mask value at (sx, sy) (zero outside), then blend one pixel of every plane."""
    cdef Py_ssize_t sh = mask.shape[0], sw = mask.shape[1], ix, iy, c
    cdef double fx, fy
    cdef float m, m00, m01, m10, m11
    if sx <= -1.0 or sy <= -1.0 or sx >= sw or sy >= sh:
        return
    ix = <Py_ssize_t>(sx + 1.0) - 1
    iy = <Py_ssize_t>(sy + 1.0) - 1
    fx = sx - ix
    fy = sy - iy
    m00 = mask[iy, ix] if iy >= 0 and ix >= 0 else 0.0
    m01 = mask[iy, ix + 1] if iy >= 0 and ix + 1 < sw else 0.0
    m10 = mask[iy + 1, ix] if iy + 1 < sh and ix >= 0 else 0.0
    m11 = mask[iy + 1, ix + 1] if iy + 1 < sh and ix + 1 < sw else 0.0
    m = <float>((1.0 - fy) * ((1.0 - fx) * m00 + fx * m01) + fy * ((1.0 - fx) * m10 + fx * m11))
    if m <= 0.0:
        return
    if m > 1.0:
        m = 1.0
    for c in range(src.shape[2]):
        planes[c, py0 + y, px0 + x] = _mix(planes[c, py0 + y, px0 + x], src[y, x, c], m)


def blend_feathered_planes(const pixel_t[:, :, ::1] src, const float[:, ::1] mask, const double[::1] inv,
                           Py_ssize_t inner_lo, Py_ssize_t inner_hi, pixel_t[:, :, ::1] planes,
                           Py_ssize_t y0, Py_ssize_t x0) -> None:
    """Blend a warped src [h,w,C] (C samples per pixel, interleaved) into C planes [C,H,W] at (y0, x0), e.g.
    Y alone (C=1) or U and V together (C=2, a frame's chroma), sampling the unwarped mask [S,S] bilinearly;
    src and planes both uint8 or both uint16.

    inv (2x3, row-major) maps a region pixel (x, y) to mask coordinates; outside the mask counts as 0,
    and mask[inner_lo..inner_hi, inner_lo..inner_hi] must be 1. Per row, the run of pixels whose
    mask value is 1 is copied, pixels off the mask are skipped, and only the feathered band is
    interpolated and blended. Replaces a separate warp of the mask.
    """
    cdef Py_ssize_t h = src.shape[0], w = src.shape[1], nc = src.shape[2], sh = mask.shape[0], sw = mask.shape[1]
    cdef Py_ssize_t y, x, c, o_first, o_last, i_first, i_last
    cdef double a0 = inv[0], a1 = inv[1], a2 = inv[2], b0 = inv[3], b1 = inv[4], b2 = inv[5]
    cdef double rx, ry
    if inv.shape[0] != 6:
        raise ValueError("inv must hold 6 values (a 2x3 affine matrix)")
    if sh != sw:
        raise ValueError("mask must be square")
    if mask.shape[0] < 2 or not (0 <= inner_lo <= inner_hi < sw):
        raise ValueError("inner range must lie inside the mask")
    if y0 < 0 or x0 < 0 or y0 + h > planes.shape[1] or x0 + w > planes.shape[2]:
        raise ValueError("region lies outside the frame")
    if planes.shape[0] != nc:
        raise ValueError("src has a different number of samples per pixel than there are planes")
    if h == 0 or w == 0:
        return
    with nogil:
        for y in range(h):
            rx = a1 * y + a2
            ry = b1 * y + b2
            _span(a0, rx, b0, ry, -1.0, <double>sw, 0.0, w, &o_first, &o_last)
            if o_first > o_last:
                continue
            _span(a0, rx, b0, ry, <double>inner_lo, <double>inner_hi, 1e-6, w, &i_first, &i_last)
            if i_first < o_first:
                i_first = o_first
            if i_last > o_last:
                i_last = o_last
            if i_first > i_last:
                i_first = o_last + 1
                i_last = o_last
            for x in range(o_first, i_first):
                _blend_band_planes(src, mask, planes, y, x, y0, x0, a0 * x + rx, b0 * x + ry)
            if nc == 1 and i_last >= i_first:
                memcpy(&planes[0, y0 + y, x0 + i_first], &src[y, i_first, 0],
                       (i_last - i_first + 1) * sizeof(pixel_t))
            else:
                for x in range(i_first, i_last + 1):
                    for c in range(nc):
                        planes[c, y0 + y, x0 + x] = src[y, x, c]
            for x in range(i_last + 1, o_last + 1):
                _blend_band_planes(src, mask, planes, y, x, y0, x0, a0 * x + rx, b0 * x + ry)


cdef inline float _bilinear(const float[:, ::1] g, double gx, double gy) noexcept nogil:
    """g sampled bilinearly at (gx, gy), zero outside (sample i sits at i)."""
    cdef Py_ssize_t gh = g.shape[0], gw = g.shape[1], ix, iy
    cdef double fx, fy, v00, v01, v10, v11
    if gx <= -1.0 or gy <= -1.0 or gx >= gw or gy >= gh:
        return 0.0
    ix = <Py_ssize_t>(gx + 1.0) - 1
    iy = <Py_ssize_t>(gy + 1.0) - 1
    fx = gx - ix
    fy = gy - iy
    v00 = g[iy, ix] if iy >= 0 and ix >= 0 else 0.0
    v01 = g[iy, ix + 1] if iy >= 0 and ix + 1 < gw else 0.0
    v10 = g[iy + 1, ix] if iy + 1 < gh and ix >= 0 else 0.0
    v11 = g[iy + 1, ix + 1] if iy + 1 < gh and ix + 1 < gw else 0.0
    return <float>((1.0 - fy) * ((1.0 - fx) * v00 + fx * v01) + fy * ((1.0 - fx) * v10 + fx * v11))


cdef inline float _clamped(const float[:, :, ::1] g, double gx, double gy, Py_ssize_t c) noexcept nogil:
    """Channel c of g sampled bilinearly at (gx, gy), the edge held outside."""
    cdef Py_ssize_t gh = g.shape[0], gw = g.shape[1], ix, iy, ix1, iy1
    cdef double fx, fy
    if gx < 0.0:
        gx = 0.0
    if gy < 0.0:
        gy = 0.0
    if gx > gw - 1.0:
        gx = gw - 1.0
    if gy > gh - 1.0:
        gy = gh - 1.0
    ix = <Py_ssize_t>gx
    iy = <Py_ssize_t>gy
    ix1 = ix + 1 if ix + 1 < gw else ix
    iy1 = iy + 1 if iy + 1 < gh else iy
    fx = gx - ix
    fy = gy - iy
    return <float>((1.0 - fy) * ((1.0 - fx) * g[iy, ix, c] + fx * g[iy, ix1, c])
                   + fy * ((1.0 - fx) * g[iy1, ix, c] + fx * g[iy1, ix1, c]))


def blend_corrected_planes(const pixel_t[:, :, ::1] src, const float[:, ::1] mask, const double[::1] inv_m,
                           const float[:, :, ::1] corr, const double[::1] inv_c, Py_ssize_t c0, float top,
                           pixel_t[:, :, ::1] planes, Py_ssize_t y0, Py_ssize_t x0) -> None:
    """The seamless paste: planes <- plane + m * (src + corr - plane), rounded and clamped to 0..top, for C planes
    [C,H,W] at (y0, x0) from a warped src [h,w,C]; m is the face mask grid [G,G] and corr the colour correction
    grid [K,K,>=c0+C] (channels c0.. for these planes), both sampled bilinearly at inv_m / inv_c (2x3, row-major:
    region pixel -> grid coordinates). Pixels where m is 0 are not touched."""
    cdef Py_ssize_t h = src.shape[0], w = src.shape[1], nc = src.shape[2], gm = mask.shape[0]
    cdef Py_ssize_t y, x, c, first, last
    cdef double a0 = inv_m[0], a1 = inv_m[1], a2 = inv_m[2], b0 = inv_m[3], b1 = inv_m[4], b2 = inv_m[5]
    cdef double p0 = inv_c[0], p1 = inv_c[1], p2 = inv_c[2], q0 = inv_c[3], q1 = inv_c[4], q2 = inv_c[5]
    cdef double rx, ry, cx, cy
    cdef float m, v, p
    if inv_m.shape[0] != 6 or inv_c.shape[0] != 6:
        raise ValueError("inv_m and inv_c must hold 6 values each (2x3 affine matrices)")
    if mask.shape[1] != gm:
        raise ValueError("mask must be square")
    if corr.shape[2] < c0 + nc:
        raise ValueError("corr has fewer channels than c0 + the planes")
    if y0 < 0 or x0 < 0 or y0 + h > planes.shape[1] or x0 + w > planes.shape[2]:
        raise ValueError("region lies outside the frame")
    if planes.shape[0] != nc:
        raise ValueError("src has a different number of samples per pixel than there are planes")
    if h == 0 or w == 0:
        return
    with nogil:
        for y in range(h):
            rx = a1 * y + a2
            ry = b1 * y + b2
            _span(a0, rx, b0, ry, -1.0, <double>gm, 0.0, w, &first, &last)
            for x in range(first, last + 1):
                m = _bilinear(mask, a0 * x + rx, b0 * x + ry)
                if m <= 0.0:
                    continue
                if m > 1.0:
                    m = 1.0
                cx = p0 * x + p1 * y + p2
                cy = q0 * x + q1 * y + q2
                for c in range(nc):
                    p = planes[c, y0 + y, x0 + x]
                    v = p + m * (<float>src[y, x, c] + _clamped(corr, cx, cy, c0 + c) - p) + 0.5
                    if v <= 0.0:
                        planes[c, y0 + y, x0 + x] = 0
                    elif v >= top:
                        planes[c, y0 + y, x0 + x] = <pixel_t>top
                    else:
                        planes[c, y0 + y, x0 + x] = <pixel_t>v
