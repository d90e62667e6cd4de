"""The DP noise's standard normal draws in numpy, where the compiled extension is missing.

normal(key, offset, j): one Philox4x32-10 block (key: ``key``'s two 32-bit halves; counter: ``offset`` in words 0-1,
``j`` in words 2-3, as ATen's ``philox_engine(key, j, offset)``), its four words made two 53-bit uniforms u1 in (0, 1)
and u2 in [0, 1), and sqrt(-2 ln u1) cos(2π u2). The same bits as ``hasfl_ray::private_normals``
(csrc/cpu/aggregate_private.cpp); numpy's log and cos may round differently from the C library's in the last place.
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


def philox_normals(key: int, offset: int, n: int) -> torch.Tensor:
    """normal(key, offset, j) for j < n, float64 (module docstring)."""
    words = philox_blocks(key, offset, n)
    x = ((words[:, 0] << _SHIFT) | words[:, 1]) >> np.uint64(11)
    y = ((words[:, 2] << _SHIFT) | words[:, 3]) >> np.uint64(11)
    scale = 2.0 ** -53
    u1 = (x.astype(np.float64) + 0.5) * scale
    u2 = y.astype(np.float64) * scale
    return torch.from_numpy(np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2))


__all__ = ["philox_blocks", "philox_normals"]
