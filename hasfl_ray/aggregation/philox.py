"""The DP noise's standard normal draws in numpy, where the compiled extension is missing.

normal(key, offset, j): one Philox4x32-10 block (key: ``key``'s two 32-bit halves; counter: ``offset`` in words 0-1,
``j`` in words 2-3, as ATen's ``philox_engine(key, j, offset)``), its four words made two 53-bit uniforms u1 in (0, 1]
and u2 in [0, 1), and sqrt(-2 ln u1) cos(2π u2), with ln and cos written out in IEEE double operations in the order
of csrc/private_normal.h (the extension's draws on the CPU and on CUDA): numpy's elementwise +, -, *, /, sqrt, frexp
and floor round as the C++ and CUDA ones do, so these are the same bits as ``hasfl_ray::private_normals``.
"""

from __future__ import annotations

import numpy as np
import torch

_ROUND_A, _ROUND_B = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_MUL_A, _MUL_B = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_LOW = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)


def philox_blocks(key: int, offset: int, n: int) -> np.ndarray:
    """(n, 4) uint64 holding the 32-bit words of the Philox4x32-10 block of each counter (offset, j), j < n."""
    key, offset = int(key) & (2 ** 64 - 1), int(offset) & (2 ** 64 - 1)
    j = np.arange(n, dtype=np.uint64)
    c0 = np.full(n, offset & 0xFFFFFFFF, np.uint64)
    c1 = np.full(n, offset >> 32, np.uint64)
    c2, c3 = j & _LOW, j >> _SHIFT
    k0, k1 = np.uint64(key & 0xFFFFFFFF), np.uint64(key >> 32)
    for round_ in range(10):
        p0, p1 = _MUL_A * c0, _MUL_B * c2  # 32 x 32 bits: exact in uint64
        c0, c1, c2, c3 = ((p1 >> _SHIFT) ^ c1 ^ k0) & _LOW, p1 & _LOW, ((p0 >> _SHIFT) ^ c3 ^ k1) & _LOW, p0 & _LOW
        if round_ < 9:
            k0, k1 = (k0 + _ROUND_A) & _LOW, (k1 + _ROUND_B) & _LOW
    return np.stack([c0, c1, c2, c3], axis=1)


def _horner(z: np.ndarray, coefficients) -> np.ndarray:
    """c_0 + z (c_1 + z (c_2 + ...)), highest first, one rounding per operation (private_normal.h's loops)."""
    p = np.full_like(z, float.fromhex(coefficients[-1]))
    for c in reversed(coefficients[:-1]):
        p = float.fromhex(c) + z * p
    return p


_LOG = ("0x1.5555555555555p-1", "0x1.999999999999ap-2", "0x1.2492492492492p-2", "0x1.c71c71c71c71cp-3",
        "0x1.745d1745d1746p-3", "0x1.3b13b13b13b14p-3", "0x1.1111111111111p-3", "0x1.e1e1e1e1e1e1ep-4",
        "0x1.af286bca1af28p-4", "0x1.8618618618618p-4", "0x1.642c8590b2164p-4")  # 2/3, 2/5, ..., 2/23
_SIN = ("-0x1.5555555555555p-3", "0x1.1111111111111p-7", "-0x1.a01a01a01a01ap-13", "0x1.71de3a556c734p-19",
        "-0x1.ae64567f544e4p-26", "0x1.6124613a86d09p-33", "-0x1.ae7f3e733b81fp-41", "0x1.952c77030ad4ap-49",
        "-0x1.2f49b46814157p-57", "0x1.71b8ef6dcf572p-66", "-0x1.761b41316381ap-75")  # -1/3!, 1/5!, ..., -1/23!
_COS = ("0x1.5555555555555p-5", "-0x1.6c16c16c16c17p-10", "0x1.a01a01a01a01ap-16", "-0x1.27e4fb7789f5cp-22",
        "0x1.1eed8eff8d898p-29", "-0x1.93974a8c07c9dp-37", "0x1.ae7f3e733b81fp-45", "-0x1.6827863b97d97p-53",
        "0x1.e542ba4020225p-62", "-0x1.0ce396db7f853p-70")  # 1/4!, -1/6!, ..., -1/22!


def log_unit(x: np.ndarray) -> np.ndarray:
    """ln x for x in (0, 1], private_normal.h's log_unit operation by operation."""
    m, e = np.frexp(x)
    small = m < float.fromhex("0x1.6a09e667f3bcdp-1")
    m = np.where(small, m * 2.0, m)
    k = np.where(small, e - 1, e).astype(np.float64)
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    r = z * _horner(z, _LOG)
    hfsq = (0.5 * f) * f
    ln2_hi, ln2_lo = float.fromhex("0x1.62e42fee00000p-1"), float.fromhex("0x1.a39ef35793c76p-33")
    return k * ln2_hi - ((hfsq - (s * (hfsq + r) + k * ln2_lo)) - f)


def cos_turn(u: np.ndarray) -> np.ndarray:
    """cos(2π u) for u in [0, 1), private_normal.h's cos_turn operation by operation."""
    t = u * 4.0
    q = np.floor(t + 0.5)
    a = (t - q) * float.fromhex("0x1.921fb54442d18p+0")
    z = a * a
    sin = a + (a * z) * _horner(z, _SIN)
    hz = 0.5 * z
    w = 1.0 - hz
    cos = w + (((1.0 - w) - hz) + (z * z) * _horner(z, _COS))
    quadrant = q.astype(np.int64) & 3
    return np.select([quadrant == 0, quadrant == 1, quadrant == 2], [cos, -sin, -cos], sin)


def philox_normals(key: int, offset: int, n: int) -> torch.Tensor:
    """normal(key, offset, j) for j < n, float64 (module docstring)."""
    words = philox_blocks(key, offset, n)
    x = ((words[:, 0] << _SHIFT) | words[:, 1]) >> np.uint64(11)
    y = ((words[:, 2] << _SHIFT) | words[:, 3]) >> np.uint64(11)
    scale = 2.0 ** -53
    u1 = (x.astype(np.float64) + 0.5) * scale
    u2 = y.astype(np.float64) * scale
    return torch.from_numpy(np.sqrt(-2.0 * log_unit(u1)) * cos_turn(u2))


__all__ = ["cos_turn", "log_unit", "philox_blocks", "philox_normals"]
