# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Blend a warped face crop into a region of a planar frame in place: plane = mask*crop + (1-mask)*plane, rounded.
Planes of 8 bits (uint8) or of 10 in 16 (uint16)."""

from libc.math cimport ceil, fabs, floor
from libc.stdint cimport uint8_t, uint16_t
from libc.stdlib cimport calloc, free, malloc, qsort
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
    _span_rect(a0, rx, b0, ry, lo, hi, lo, hi, eps, w, first, last)


cdef inline void _span_rect(double a0, double rx, double b0, double ry, double xlo, double xhi, double ylo,
                            double yhi, double eps, Py_ssize_t w, Py_ssize_t* first, Py_ssize_t* last) noexcept nogil:
    """Integer x in [0, w) with xlo+eps <= a0*x+rx <= xhi-eps and ylo+eps <= b0*x+ry <= yhi-eps; first > last if
    none."""
    cdef double xa, xb, ya, yb
    _solve(a0, rx, xlo + eps, xhi - eps, &xa, &xb)
    _solve(b0, ry, ylo + eps, yhi - eps, &ya, &yb)
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
                                    const uint8_t* kind, pixel_t[:, :, ::1] planes, Py_ssize_t y, Py_ssize_t x,
                                    Py_ssize_t py0, Py_ssize_t px0, double sx, double sy) noexcept nogil:
    """Bilinear mask value at (sx, sy) (zero outside), then blend one pixel of every plane. `kind` (or NULL): per
    mask cell (see _cell_kinds), 0 skips the pixel and 1 copies it, as the bilinear value would (0, or 1 in effect)."""
    cdef Py_ssize_t sh = mask.shape[0], sw = mask.shape[1], ix, iy, c
    cdef double fx, fy
    cdef float m, m00, m01, m10, m11
    cdef uint8_t k
    if sx <= -1.0 or sy <= -1.0 or sx >= sw or sy >= sh:
        return
    ix = <Py_ssize_t>(sx + 1.0) - 1
    iy = <Py_ssize_t>(sy + 1.0) - 1
    if kind != NULL:
        k = kind[(iy + 1) * (sw + 1) + ix + 1]
        if k == 0:
            return
        if k == 1:
            for c in range(src.shape[2]):
                planes[c, py0 + y, px0 + x] = src[y, x, c]
            return
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


cdef void _cell_kinds(const float[:, ::1] mask, uint8_t* kind) noexcept nogil:
    """Per cell of the bilinear mask (the square between samples (iy, ix) and (iy + 1, ix + 1), ix and iy from -1 to
    S-1, samples outside the mask 0), at kind[(iy + 1) * (S + 1) + ix + 1]: 0 where all four corners are 0, 1 where
    all are at least 1, else 2."""
    cdef Py_ssize_t sh = mask.shape[0], sw = mask.shape[1], ix, iy, jx, jy, lo, hi
    cdef float v
    for iy in range(-1, sh):
        for ix in range(-1, sw):
            lo = 0
            hi = 0
            for jy in range(iy, iy + 2):
                for jx in range(ix, ix + 2):
                    v = mask[jy, jx] if 0 <= jy < sh and 0 <= jx < sw else 0.0
                    if v > 0.0:
                        lo += 1
                    if v >= 1.0:
                        hi += 1
            kind[(iy + 1) * (sw + 1) + ix + 1] = 0 if lo == 0 else (1 if hi == 4 else 2)


cdef void _blend_region(const pixel_t[:, :, ::1] src, const float[:, ::1] mask, const uint8_t* kind,
                        const double[::1] inv, double ix0, double ix1, double iy0, double iy1, double ox0, double ox1,
                        double oy0, double oy1, pixel_t[:, :, ::1] planes, Py_ssize_t y0, Py_ssize_t x0) noexcept:
    """The blend of a checked region: per row, the run inside the inner rectangle (mask 1) copied, pixels outside
    the outer one skipped, the rest blended with the bilinear mask (through `kind`, when not NULL)."""
    cdef Py_ssize_t h = src.shape[0], w = src.shape[1], nc = src.shape[2]
    cdef Py_ssize_t y, x, c, o_first, o_last, i_first, i_last
    cdef double a0 = inv[0], a1 = inv[1], a2 = inv[2], b0 = inv[3], b1 = inv[4], b2 = inv[5]
    cdef double rx, ry
    with nogil:
        for y in range(h):
            rx = a1 * y + a2
            ry = b1 * y + b2
            _span_rect(a0, rx, b0, ry, ox0, ox1, oy0, oy1, 0.0, w, &o_first, &o_last)
            if o_first > o_last:
                continue
            _span_rect(a0, rx, b0, ry, ix0, ix1, iy0, iy1, 1e-6, w, &i_first, &i_last)
            if i_first < o_first:
                i_first = o_first
            if i_last > o_last:
                i_last = o_last
            if i_first > i_last:
                i_first = o_last + 1
                i_last = o_last
            for x in range(o_first, i_first):
                _blend_band_planes(src, mask, kind, planes, y, x, y0, x0, a0 * x + rx, b0 * x + ry)
            if nc == 1 and i_last >= i_first:
                memcpy(&planes[0, y0 + y, x0 + i_first], &src[y, i_first, 0],
                       (i_last - i_first + 1) * sizeof(pixel_t))
            else:
                for x in range(i_first, i_last + 1):
                    for c in range(nc):
                        planes[c, y0 + y, x0 + x] = src[y, x, c]
            for x in range(i_last + 1, o_last + 1):
                _blend_band_planes(src, mask, kind, planes, y, x, y0, x0, a0 * x + rx, b0 * x + ry)


cdef int _check_region(const pixel_t[:, :, ::1] src, pixel_t[:, :, ::1] planes, Py_ssize_t y0,
                       Py_ssize_t x0) except -1:
    """ValueError unless src [h,w,C] fits the C planes at (y0, x0)."""
    if y0 < 0 or x0 < 0 or y0 + src.shape[0] > planes.shape[1] or x0 + src.shape[1] > planes.shape[2]:
        raise ValueError("region lies outside the frame")
    if planes.shape[0] != src.shape[2]:
        raise ValueError("src has a different number of samples per pixel than there are planes")
    return 0


def blend_masked_planes(const pixel_t[:, :, ::1] src, const float[:, ::1] mask, const double[::1] inv,
                        const double[::1] inner, const double[::1] outer, pixel_t[:, :, ::1] planes,
                        Py_ssize_t y0, Py_ssize_t x0) -> None:
    """Blend a warped src [h,w,C] (C samples per pixel, interleaved) into C planes [C,H,W] at (y0, x0), e.g. Y alone
    (C=1) or U and V together (C=2), src and planes both uint8 or both uint16. `inv` (2x3, row-major) maps a region
    pixel (x, y) to coordinates of the unwarped mask [S,S] (sampled bilinearly, 0 outside it): `inner` (x0, x1, y0,
    y1, mask coordinates) is a rectangle where the mask is 1 (copied), `outer` one outside which it is 0 (skipped);
    between them the mask is sampled and blended. Replaces a separate warp of the mask."""
    if inv.shape[0] != 6 or inner.shape[0] != 4 or outer.shape[0] != 4:
        raise ValueError("inv must hold 6 values (a 2x3 affine matrix), inner and outer 4 (x0, x1, y0, y1)")
    _check_region(src, planes, y0, x0)
    cdef Py_ssize_t cells = (mask.shape[0] + 1) * (mask.shape[1] + 1)
    cdef uint8_t* kind = NULL
    if 4 * cells < src.shape[0] * src.shape[1]:    # a coarse mask over a large region: classify its cells once
        kind = <uint8_t*>malloc(cells)
        if kind == NULL:
            raise MemoryError()
        _cell_kinds(mask, kind)
    try:
        _blend_region(src, mask, kind, inv, inner[0], inner[1], inner[2], inner[3], outer[0], outer[1], outer[2],
                      outer[3], planes, y0, x0)
    finally:
        free(kind)



cdef int _cmp_double(const void* a, const void* b) noexcept nogil:
    cdef double x = (<const double*>a)[0], y = (<const double*>b)[0]
    return (x > y) - (x < y)


cdef double _median(double* v, Py_ssize_t n) noexcept nogil:
    """The median of v[0:n] (n > 0; the mean of the middle two for an even n), sorting v in place."""
    qsort(v, n, sizeof(double), _cmp_double)
    if n % 2:
        return v[n // 2]
    return 0.5 * (v[n // 2 - 1] + v[n // 2])


cdef inline double _sample(const pixel_t[:, :, ::1] planes, Py_ssize_t p, double x, double y) noexcept nogil:
    """Plane p sampled bilinearly at (x, y), clamped to its edge samples (planes at least 2x2)."""
    cdef Py_ssize_t h = planes.shape[1], w = planes.shape[2], x0, y0
    cdef double ax, ay
    x = 0.0 if x < 0.0 else (w - 1.0 if x > w - 1.0 else x)
    y = 0.0 if y < 0.0 else (h - 1.0 if y > h - 1.0 else y)
    x0 = <Py_ssize_t>x
    y0 = <Py_ssize_t>y
    if x0 > w - 2:
        x0 = w - 2
    if y0 > h - 2:
        y0 = h - 2
    ax = x - x0
    ay = y - y0
    return ((planes[p, y0, x0] * (1 - ax) + planes[p, y0, x0 + 1] * ax) * (1 - ay)
            + (planes[p, y0 + 1, x0] * (1 - ax) + planes[p, y0 + 1, x0 + 1] * ax) * ay)


cdef inline void _tap(Py_ssize_t i, Py_ssize_t n, Py_ssize_t* at, Py_ssize_t* nxt, double* a) noexcept nogil:
    """Output sample i of a 2x bilinear upsampling of n samples, as cv2.resize places it: source samples at, nxt
    and the weight a of nxt (edge samples repeated)."""
    cdef double f = (i + 0.5) * 0.5 - 0.5
    at[0] = <Py_ssize_t>floor(f)
    a[0] = f - at[0]
    if at[0] < 0:
        at[0], a[0] = 0, 0.0
    if at[0] >= n - 1:
        at[0], a[0] = n - 1, 0.0
    nxt[0] = at[0] + 1 if at[0] < n - 1 else at[0]


cdef void _pull(const double* coarse, Py_ssize_t n, double* up) noexcept nogil:
    """coarse [n, n, 3] upsampled 2x bilinearly into up [2n, 2n, 3], as cv2.resize does (edge samples repeated)."""
    cdef Py_ssize_t m = 2 * n, x, y, c, ix, jx, iy, jy
    cdef double ax, ay
    for y in range(m):
        _tap(y, n, &iy, &jy, &ay)
        for x in range(m):
            _tap(x, n, &ix, &jx, &ax)
            for c in range(3):
                up[(y * m + x) * 3 + c] = (
                    (1 - ay) * ((1 - ax) * coarse[(iy * n + ix) * 3 + c] + ax * coarse[(iy * n + jx) * 3 + c])
                    + ay * ((1 - ax) * coarse[(jy * n + ix) * 3 + c] + ax * coarse[(jy * n + jx) * 3 + c]))


cdef void _push_pull(double* values, double* weights, Py_ssize_t k) noexcept nogil:
    """values [k, k, 3] (weighted sums) and weights [k, k] filled where the weights are 0 (seam.push_pull's rule), in
    place: values end as the filled grid. k a power of two."""
    cdef Py_ssize_t n, h, x, y, c, j
    cdef double* v
    cdef double* w
    cdef double* up
    cdef double keep, s
    if k == 1:
        s = weights[0] if weights[0] > 1e-12 else 1e-12
        for c in range(3):
            values[c] /= s
        return
    h = k // 2
    v = <double*>calloc(h * h * 3, sizeof(double))
    w = <double*>calloc(h * h, sizeof(double))
    up = <double*>malloc(k * k * 3 * sizeof(double))
    for y in range(k):
        for x in range(k):
            j = (y // 2) * h + x // 2
            w[j] += weights[y * k + x]
            for c in range(3):
                v[j * 3 + c] += values[(y * k + x) * 3 + c]
    _push_pull(v, w, h)
    _pull(v, h, up)
    for j in range(k * k):
        s = weights[j] if weights[j] > 1e-12 else 1e-12
        keep = weights[j] if weights[j] < 1.0 else 1.0
        for c in range(3):
            values[j * 3 + c] = keep * (values[j * 3 + c] / s) + (1.0 - keep) * up[j * 3 + c]
    free(v)
    free(w)
    free(up)


def seam_correction(const float[:, ::1] mask, const float[:, :, ::1] crop_yuv, const pixel_t[:, :, ::1] luma,
                    const pixel_t[:, :, ::1] chroma, const double[::1] m, Py_ssize_t chroma_rows, double cell,
                    double edge_lo, double edge_hi, double bound, float[:, :, ::1] out) -> int:
    """seam.SeamMatch's correction of one frame, before its running mean, into out [K, K, 3] (K a power of two):
    plate - crop at the mask's edge cells (lo < mask < hi; `cell` crop pixels per mask cell, `m` the 2x3 crop ->
    frame matrix), samples further than `bound` from their median left out, binned, push-pulled, held within the
    bound of the median (0 where no edge sample is on the frame). Returns the number of edge cells."""
    cdef Py_ssize_t g = mask.shape[0], k = out.shape[0], i, r, q, n = 0, used = 0, c, j, edges = 0
    cdef Py_ssize_t fh = luma.shape[1], fw = luma.shape[2]
    cdef double xs, ys, fx, fy, cx, cy, lo, hi
    cdef double centre[3]
    cdef double* diff
    cdef double* tmp
    cdef double* values
    cdef double* weights
    if crop_yuv.shape[0] != g or crop_yuv.shape[1] != g or crop_yuv.shape[2] != 3 or mask.shape[1] != g or \
            out.shape[1] != k or out.shape[2] != 3 or k & (k - 1) or m.shape[0] != 6 or luma.shape[0] != 1 or \
            chroma.shape[0] != 2 or fh < 2 or fw < 2 or chroma.shape[1] < 2 or chroma.shape[2] < 2:
        raise ValueError("seam_correction: mismatched shapes")
    diff = <double*>malloc(g * g * 3 * sizeof(double))
    tmp = <double*>malloc(g * g * sizeof(double))
    values = <double*>calloc(k * k * 3, sizeof(double))
    weights = <double*>calloc(k * k, sizeof(double))
    cdef Py_ssize_t* where = <Py_ssize_t*>malloc(g * g * sizeof(Py_ssize_t))
    try:
        with nogil:
            for r in range(g):
                for q in range(g):
                    if not (edge_lo < mask[r, q] < edge_hi):
                        continue
                    edges += 1
                    xs = (q + 0.5) * cell - 0.5
                    ys = (r + 0.5) * cell - 0.5
                    fx = m[0] * xs + m[1] * ys + m[2]
                    fy = m[3] * xs + m[4] * ys + m[5]
                    if fx < 0 or fy < 0 or fx > fw - 1 or fy > fh - 1:
                        continue
                    cx = (fx - 0.5) / 2
                    cy = (fy - 0.5 * (chroma_rows - 1)) / chroma_rows
                    diff[n * 3] = _sample(luma, 0, fx, fy) - crop_yuv[r, q, 0]
                    diff[n * 3 + 1] = _sample(chroma, 0, cx, cy) - crop_yuv[r, q, 1]
                    diff[n * 3 + 2] = _sample(chroma, 1, cx, cy) - crop_yuv[r, q, 2]
                    where[n] = (r * k // g) * k + q * k // g
                    n += 1
            if n == 0:
                for j in range(k * k):
                    for c in range(3):
                        out[j // k, j % k, c] = 0.0
            else:
                for c in range(3):
                    for i in range(n):
                        tmp[i] = diff[i * 3 + c]
                    centre[c] = _median(tmp, n)
                for i in range(n):
                    if fabs(diff[i * 3] - centre[0]) <= bound and fabs(diff[i * 3 + 1] - centre[1]) <= bound and \
                            fabs(diff[i * 3 + 2] - centre[2]) <= bound:
                        j = where[i]
                        weights[j] += 1.0
                        for c in range(3):
                            values[j * 3 + c] += diff[i * 3 + c]
                        used += 1
                if used:
                    for j in range(k * k):      # a cell's mean with weight 1 (seam.py's rule)
                        if weights[j] > 0:
                            for c in range(3):
                                values[j * 3 + c] /= weights[j]
                            weights[j] = 1.0
                    _push_pull(values, weights, k)
                for j in range(k * k):
                    for c in range(3):
                        lo = centre[c] - bound
                        hi = centre[c] + bound
                        fx = values[j * 3 + c] if used else 0.0
                        out[j // k, j % k, c] = <float>(lo if fx < lo else (hi if fx > hi else fx))
        return edges
    finally:
        free(diff)
        free(tmp)
        free(values)
        free(weights)
        free(where)
