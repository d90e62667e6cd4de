"""Freed memory handed back to the system once a round's holes add up (issue 46 item 4): a long run's resident
memory stays flat.

glibc raises its mmap threshold to the size of every mmapped block that is freed (up to 32 MiB), so after the
first rounds a round's activations and packed updates (hundreds of KiB to tens of MiB, of sizes that change with
every continuous width) come from the heap, and the holes they leave stay resident: over 200 EMNIST rounds of HAS-FL
the driver's RSS wandered 1004-1213 MiB while what the run held (its RSS after ``malloc_trim``) stayed within 1 %
(benchmarks/RESULTS.md, "Memory over long runs"). :func:`release` is asked once a round in each process that
trains or aggregates (the driver's engine after each round, or with Ray while the next round trains, and after each
asynchronous server update; each Ray trainer once a model, as its evaluation ends or else as the next model arrives;
the server actor after each round and evaluation) and calls glibc's ``malloc_trim(0)`` when it is due: the first
time, and then whenever the process's resident memory has grown more than :data:`BOUND` (1.75 %) above what it held
right after its last trim. So RSS stays within that bound of what the run holds. A trim's price is the pages the
next round touches again: a digits round on a Ray trainer regrew ~9-10 MiB (1.4-1.5 % of its RSS) after every trim,
2,600 page faults, ~11 ms of the two trainers' CPU a round on a fast host and ~22 ms on a slow one (issue 46 item 3,
benchmarks/RESULTS.md); a round that frees less than the bound above what the process holds now leaves it in
the heap for the next round, and a trim follows only once the heap's holes have added up. So a round should free
few: the image CNN's norms write over their input without autograd (hasfl_ray/models/cnn.py, ``BatchNorm2d``: a
digits evaluation round ~1,000-1,150 pages fewer); pinning the mmap threshold instead (``mallopt``) cost more, on every
large allocation of every local step. ``HASFL_MALLOC_TRIM=always`` trims on every request (the behaviour before
2026-11-29), ``HASFL_MALLOC_TRIM=0`` turns it off. Nothing here changes a result: only
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
from typing import Dict, MutableMapping, Optional

VARIABLE = "HASFL_MALLOC_TRIM"
#: PyTorch's own switch (c10's ``alloc_cpu``, read once, at torch's first allocation): every CPU tensor of 2 MiB and
#: more aligned to 2 MiB and advised as transparent huge pages. glibc mmaps every block over its threshold (at most
#: 32 MiB) afresh and unmaps it when freed, so each large activation of a forward pass is page-faulted in 4 KiB at a
#: time: EMNIST's full-width test pass (batches of 500, activations of 100 MB) spent 1.8 s of its 5.7 s of CPU in
#: the kernel so, 1.0 million minor faults; with huge pages 0.4-0.55 s (issue 46 item 1, benchmarks/bench_eval.py).
#: Only where memory comes from: the same values.
HUGE_PAGES = "THP_MEM_ALLOC_ENABLE"
PRIMITIVES = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
#: oneDNN primitives a process keeps (a few clients' convolutions at a few widths: ResNet-18's 20 convolutions x 3
#: passes x 4 widths fit), against oneDNN's own 1024.
PRIMITIVE_CACHE = 256
_trim = []  # [the C function] or [None], looked up once
#: Requests (:func:`release` asked, trimming or not), trims made (``calls``) and seconds spent trimming in this
#: process, for tests and benchmarks (soak.py prints them).
spent: Dict[str, float] = {"requests": 0, "calls": 0, "seconds": 0.0}
#: A process trims again once its RSS is more than this fraction above its RSS right after its last trim: under
#: issue 46 item 4's 2 % (what a long run's RSS may grow), above the 1.4-1.5 % a digits round regrows on a trainer.
BOUND = 0.0175
_held: list = []  # [this process's resident bytes right after its last trim]
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _function():
    if not _trim:
        try:
            _trim.append(ctypes.CDLL(None).malloc_trim)
        except (OSError, AttributeError):
            _trim.append(None)
    return _trim[0]


#: What :data:`VARIABLE` may say (blanks around and case aside; unset or empty: ``1``): ``1`` trims when due,
#: ``always`` on every request, ``0`` never.
MODES = ("1", "always", "0")


def mode() -> Optional[str]:
    """This process's :data:`VARIABLE` as one of :data:`MODES`, or None where it says something else (``off``,
    ``true``, a misspelling: refused by :func:`check_variable`, where a run starts; before, it trimmed as if unset)."""
    value = os.environ.get(VARIABLE, "").strip().lower() or "1"
    return value if value in MODES else None


def check_variable() -> None:
    """Refuse, in one sentence and before a run makes anything, a :data:`VARIABLE` that is not one of :data:`MODES`:
    ``HASFL_MALLOC_TRIM=off`` used to be read as "trim when due", the opposite of what it asks."""
    if mode() is None:
        from hasfl_ray.errors import ConfigError

        raise ConfigError(f"{VARIABLE} is {os.environ[VARIABLE]!r} in the environment; expected always (trim every "
                          "round), 0 (never) or 1 or unset (once RSS grows 1.75 %)")


def enabled() -> bool:
    return mode() != "0" and _function() is not None


def resident() -> int:
    """This process's resident memory in bytes (``/proc/self/statm``), 0 where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def release() -> None:
    """Hand the memory freed since the last trim back to the system (glibc's ``malloc_trim(0)``) when it is due: the
    first time, and whenever this process's RSS is more than :data:`BOUND` above what it held right after its last
    trim (every time with ``HASFL_MALLOC_TRIM=always``; never with ``0``)."""
    if not enabled():
        return
    spent["requests"] += 1
    if _held and mode() != "always":
        now = resident()
        if now and now <= _held[0] * (1.0 + BOUND):
            return
    start = time.perf_counter()
    _function()(0)
    spent["calls"] += 1
    spent["seconds"] += time.perf_counter() - start
    _held[:] = [resident()]


def huge_pages(environ: Optional[MutableMapping[str, str]] = None) -> str:
    """Set :data:`HUGE_PAGES` to 1 in ``environ`` (default: this process's) unless it is set already (a user's 0
    stays); returns its value. Call it before torch is imported: torch reads it once (the console script does, next
    to the OpenMP wait policy, and every Ray actor starts with it: hasfl_ray/threads.py)."""
    environ = os.environ if environ is None else environ
    environ.setdefault(HUGE_PAGES, "1")
    return environ[HUGE_PAGES]


def pages() -> str:
    """For ``hasfl-ray info``: the pages this process's large CPU tensors come in."""
    value = os.environ.get(HUGE_PAGES)
    if value == "1":
        return f"transparent huge pages ({HUGE_PAGES}=1)"
    return f"4 KiB pages ({HUGE_PAGES}={value if value is not None else 'unset'})"


def bound_primitive_cache(environ=None) -> str:
    """Set ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` to :data:`PRIMITIVE_CACHE` in ``environ`` (default: this process's)
    unless set to a capacity (digits: a non-negative integer); returns the capacity in force. Another value (``abc``,
    ``-5``, an empty one) is replaced, as OpenMP's wait policy is, and remembered for ``hasfl-ray info``: oneDNN reads it with
    ``atoi``, so ``abc`` would silently turn the cache off rather than bound it."""
    environ = os.environ if environ is None else environ
    value = environ.get(PRIMITIVES)
    if value is not None and not (value.strip().isdigit() and value.strip().isascii()):
        _replaced_capacity[:] = [value]
        environ[PRIMITIVES] = str(PRIMITIVE_CACHE)
    return environ.setdefault(PRIMITIVES, str(PRIMITIVE_CACHE))


_replaced_capacity: list = []  # [the environment's value] where bound_primitive_cache replaced it


def primitive_cache_status() -> str:
    """For ``hasfl-ray info``."""
    value = os.environ.get(PRIMITIVES)
    if _replaced_capacity and value == str(PRIMITIVE_CACHE):
        return (f"oneDNN keeps at most {value} compiled primitives ({PRIMITIVES}, set by hasfl-ray in place of the "
                f"environment's {_replaced_capacity[0]!r}, which is not a count)")
    return f"oneDNN keeps at most {value} compiled primitives ({PRIMITIVES})" if value else \
        f"oneDNN's default (1024 compiled primitives; {PRIMITIVES} unset)"


def status() -> str:
    """For ``hasfl-ray info``."""
    if mode() is None:
        return (f"{VARIABLE}={os.environ[VARIABLE]!r} is not a setting (expected always, 0, or 1 or unset): a run "
                "refuses it")
    if _function() is None:
        return "kept by the C library (no malloc_trim here)"
    if not enabled():
        return f"kept by the allocator ({VARIABLE}=0)"
    if mode() == "always":
        return f"handed back after every round (malloc_trim; {VARIABLE}=always)"
    return f"handed back once RSS is {BOUND:.2%} above what the process held after its last malloc_trim"


__all__ = ["BOUND", "HUGE_PAGES", "MODES", "PRIMITIVES", "PRIMITIVE_CACHE", "VARIABLE", "bound_primitive_cache",
           "check_variable", "enabled", "huge_pages", "mode", "pages", "primitive_cache_status", "release", "resident",
           "spent", "status"]
