"""Freed memory handed back to the system after every round (issue 46 item 4): a long run's resident memory stays
flat.

glibc raises its mmap threshold to the size of every mmapped block that is freed (up to 32 MiB), so after the
first rounds a round's activations and packed updates (hundreds of KiB to tens of MiB, of sizes that change with
every continuous width) come from the heap, and the holes they leave stay resident: over 200 EMNIST rounds of HAS-FL
the driver's RSS wandered 1004-1213 MiB while what the run held (its RSS after ``malloc_trim``) stayed within 1 %
(benchmarks/RESULTS.md, "Memory over long runs"). :func:`release` calls glibc's ``malloc_trim(0)`` once a
round in each process that trains or aggregates (the driver's engine after each round or asynchronous server
update, each Ray trainer after each call and evaluation, the server actor after each round and evaluation), so RSS
is what the run holds. Its price is the pages the next round
touches again (RESULTS.md gives it per round); pinning the mmap threshold instead (``mallopt``) cost more, on every
large allocation of every local step. ``HASFL_MALLOC_TRIM=0`` turns it off. Nothing here changes a result: only
where freed memory goes. Where the C library has no ``malloc_trim`` (macOS, musl) it does nothing, and
``hasfl-ray info`` says so.

oneDNN, which runs torch's CPU convolutions, caches a compiled primitive per convolution shape (forward and both
backward passes), up to 1024 by default: continuous widths make new channel counts for a long time, so that cache
kept filling (some 80 KB a primitive), the driver's RSS creeping ~3 MiB per 100 EMNIST rounds long after warm-up.
:func:`bound_primitive_cache` (called when hasfl_ray is imported, before any convolution runs: oneDNN reads the
variable when it builds its first primitive) sets ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` to
:data:`PRIMITIVE_CACHE` unless it is set already; a capacity the user set is left as it is. The primitives are the
same whether cached or rebuilt: nothing here changes a result either.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Dict

VARIABLE = "HASFL_MALLOC_TRIM"
PRIMITIVES = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
#: oneDNN primitives a process keeps (a few clients' convolutions at a few widths: ResNet-18's 20 convolutions x 3
#: passes x 4 widths fit), against oneDNN's own 1024.
PRIMITIVE_CACHE = 256
_trim = []  # [the C function] or [None], looked up once
#: Calls made and seconds spent in this process, for benchmarks (soak.py prints them).
spent: Dict[str, float] = {"calls": 0, "seconds": 0.0}


def _function():
    if not _trim:
        try:
            _trim.append(ctypes.CDLL(None).malloc_trim)
        except (OSError, AttributeError):
            _trim.append(None)
    return _trim[0]


def enabled() -> bool:
    return os.environ.get(VARIABLE, "1") != "0" and _function() is not None


def release() -> None:
    """Hand the memory freed since the last call back to the system (glibc's ``malloc_trim(0)``), unless turned
    off."""
    if not enabled():
        return
    start = time.perf_counter()
    _function()(0)
    spent["calls"] += 1
    spent["seconds"] += time.perf_counter() - start


def bound_primitive_cache(environ=None) -> str:
    """Set ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` to :data:`PRIMITIVE_CACHE` in ``environ`` (default: this process's)
    unless set; returns the capacity in force."""
    environ = os.environ if environ is None else environ
    return environ.setdefault(PRIMITIVES, str(PRIMITIVE_CACHE))


def primitive_cache_status() -> str:
    """For ``hasfl-ray info``."""
    value = os.environ.get(PRIMITIVES)
    return f"oneDNN keeps at most {value} compiled primitives ({PRIMITIVES})" if value else \
        f"oneDNN's default (1024 compiled primitives; {PRIMITIVES} unset)"


def status() -> str:
    """For ``hasfl-ray info``."""
    if _function() is None:
        return "kept by the C library (no malloc_trim here)"
    if not enabled():
        return f"kept by the allocator ({VARIABLE}=0)"
    return "handed back after every round (malloc_trim)"


__all__ = ["PRIMITIVES", "PRIMITIVE_CACHE", "VARIABLE", "bound_primitive_cache", "enabled", "primitive_cache_status",
           "release", "spent", "status"]
