"""CPU seconds of a run's processes, by kind, and of the whole machine, sampled from /proc while the run runs, so a
benchmark can say, over the same window as its rate, where a round's CPU went (the driver, each Ray trainer, Ray's
own daemons) and how much CPU processes outside the run took meanwhile (a busy machine, or a first repeat that ran
beside something else). Linux only (elsewhere: no samples, and :meth:`CpuWatch.window` says so with None).

    watch = CpuWatch(process.pid); watch.start(); ...; watch.stop()
    per_kind, outside = watch.window(start, end)       # CPU seconds in [start, end] (time.perf_counter())
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from typing import Dict, List, Optional, Tuple

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: The kinds of a run's processes, by their name (``comm``): the run's own process is ``driver``.
KINDS = (("ray::TrainerAct", "trainer"), ("raylet", "raylet"), ("gcs_server", "gcs"))


def _stat(pid: int) -> Optional[Tuple[str, int, float]]:
    """(comm, parent pid, CPU seconds of all its threads) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    comm = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    return comm, int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def _machine_busy() -> float:
    """CPU seconds every core of the machine spent busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat", encoding="utf-8") as handle:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, handle.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / TICK


class CpuWatch:
    """Samples, every ``every`` seconds in a thread, the CPU seconds of the process ``root`` and of each of its
    descendants (found anew every ``find_every`` seconds), and the machine's busy CPU seconds."""

    def __init__(self, root: int, every: float = 0.05, find_every: float = 0.5):
        self.root, self.every, self.find_every = root, every, find_every
        self.times: List[float] = []
        self.samples: List[Tuple[Dict[int, Tuple[str, float]], float]] = []
        self._known: Dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-watch", daemon=True)

    def start(self) -> "CpuWatch":
        if os.path.exists("/proc/stat"):
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _find(self) -> None:
        parents: Dict[int, int] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                stat = _stat(int(name))
                if stat is not None:
                    parents[int(name)] = stat[1]
        for pid in parents:
            ancestor, hops = pid, 0
            while ancestor in parents and ancestor != self.root and hops < 64:
                ancestor, hops = parents[ancestor], hops + 1
            if ancestor == self.root:
                self._known.setdefault(pid, "")

    def _loop(self) -> None:
        found = 0.0
        while not self._stop.is_set():
            now = time.perf_counter()
            if now - found >= self.find_every:
                self._find()
                found = now
            taken: Dict[int, Tuple[str, float]] = {}
            for pid in list(self._known):
                stat = _stat(pid)
                if stat is not None:
                    taken[pid] = (stat[0], stat[2])
            self.samples.append((taken, _machine_busy()))
            self.times.append(time.perf_counter())
            self._stop.wait(self.every)

    def _kind(self, pid: int, comm: str) -> str:
        if pid == self.root:
            return "driver"
        return next((kind for prefix, kind in KINDS if comm.startswith(prefix)), "other")

    def window(self, start: float, end: float) -> Optional[Tuple[Dict[str, List[float]], float]]:
        """CPU seconds between the samples nearest ``start`` and ``end``: per kind, one entry per process of that
        kind (trainers apart), and the machine's busy seconds outside the run's processes; None without samples."""
        if len(self.times) < 2:
            return None

        def nearest(moment: float) -> int:
            i = bisect.bisect_left(self.times, moment)
            return min((j for j in (i - 1, i) if 0 <= j < len(self.times)),
                       key=lambda j: abs(self.times[j] - moment))

        (first, busy_first), (last, busy_last) = self.samples[nearest(start)], self.samples[nearest(end)]
        kinds: Dict[str, List[float]] = {}
        for pid, (comm, seconds) in last.items():
            before = first.get(pid, (comm, 0.0))[1] if pid in first else 0.0
            kinds.setdefault(self._kind(pid, comm), []).append(seconds - before)
        own = sum(sum(values) for values in kinds.values())
        return kinds, (busy_last - busy_first) - own
