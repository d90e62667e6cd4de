"""Freed memory handed back once it piles up (hasfl_ray/allocator.py, issue 46 item 4)."""

import subprocess
import sys
import textwrap

import pytest

from hasfl_ray import allocator, simulate

needs_glibc = pytest.mark.skipif(allocator._function() is None, reason="needs glibc's malloc_trim (Linux)")


@needs_glibc
def test_release_returns_freed_heap_memory_to_the_system():
    """Blocks freed in the middle of glibc's heap stay resident until malloc_trim hands them back."""
    code = textwrap.dedent("""
        import ctypes, os
        from hasfl_ray import allocator
        libc = ctypes.CDLL(None)
        def rss():
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        libc.free(libc.malloc(16 << 20))  # a freed mmapped block raises the threshold: what follows is heap
        blocks = [libc.malloc(1 << 20) for _ in range(200)]
        for b in blocks:
            ctypes.memset(b, 1, 1 << 20)
        for b in blocks[:-1]:
            libc.free(b)  # the last one stays: the heap's top is not free, nothing trims itself
        before = rss()
        allocator.release()  # the first call knows no steady level yet: it trims
        print(before - rss(), allocator.spent["trims"])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    freed, calls = out.stdout.split()
    assert float(freed) > 100, out.stdout  # about 199 MiB handed back
    assert int(calls) == 1


class _Fake:
    """The process's resident memory as a test sets it, and the trims done."""

    def __init__(self, monkeypatch, resident):
        self.resident, self.trims = resident, 0
        monkeypatch.setattr(allocator, "resident_bytes", lambda: self.resident)
        monkeypatch.setattr(allocator, "_function", lambda: self.trim)
        monkeypatch.setattr(allocator, "_level", {"steady": None, "measure": 0})
        monkeypatch.setattr(allocator, "spent", {"calls": 0, "trims": 0, "seconds": 0.0})
        monkeypatch.delenv(allocator.VARIABLE, raising=False)

    def trim(self, pad):
        assert pad == 0
        self.trims += 1


def test_a_trim_waits_for_the_resident_memory_to_grow_past_the_slack_over_its_steady_level(monkeypatch):
    """Trimming every round handed back the pages the next round faulted in again (~3,500 minor faults a digits round
    a process, ~13 ms of Ray's two trainers' CPU a round): now the first call after a trim measures the steady level
    (what the run holds plus what a round touches again), and only growth past the slack over it trims."""
    mib = 1 << 20
    fake = _Fake(monkeypatch, 600 * mib)
    allocator.release()
    assert fake.trims == 1  # no steady level known yet
    fake.resident = 640 * mib  # the next round faults its working set in again
    allocator.release()
    assert fake.trims == 1 and allocator._level["steady"] == 640 * mib
    assert allocator.slack(640 * mib) == 8 * mib  # 1 % is 6.4 MiB: the floor
    for resident in (640, 645, 648, 641):  # rounds that reuse what the last freed: nothing to hand back
        fake.resident = resident * mib
        allocator.release()
    assert fake.trims == 1
    fake.resident = 648 * mib + 1  # grown past the slack
    allocator.release()
    assert fake.trims == 2 and allocator._level["measure"] == 1
    fake.resident = 630 * mib
    allocator.release()  # measures the new steady level
    assert fake.trims == 2 and allocator._level["steady"] == 630 * mib
    assert allocator.slack(2000 * mib) == 20 * mib  # 1 % above the floor
    assert allocator.spent["calls"] == 8 and allocator.spent["trims"] == 2


def test_without_proc_every_call_trims(monkeypatch):
    fake = _Fake(monkeypatch, None)
    for _ in range(3):
        allocator.release()
    assert fake.trims == 3
    monkeypatch.setenv(allocator.VARIABLE, "0")
    allocator.release()
    assert fake.trims == 3 and allocator.spent["calls"] == 3


@needs_glibc
def test_once_a_round_and_the_same_bits(tmp_path, monkeypatch):
    monkeypatch.delenv(allocator.VARIABLE, raising=False)
    calls, trims = allocator.spent["calls"], allocator.spent["trims"]
    trimmed = simulate(dataset="digits", rounds=8, clients=6, clients_per_round=3, backend="local",
                       out_dir=str(tmp_path / "on"))
    assert allocator.spent["calls"] - calls == 8
    # a steady run reuses what its last round freed: it trims far less than once a round (one run here: 1 in 40)
    assert allocator.spent["trims"] - trims <= 4
    monkeypatch.setenv(allocator.VARIABLE, "0")
    assert not allocator.enabled()
    kept = simulate(dataset="digits", rounds=8, clients=6, clients_per_round=3, backend="local",
                    out_dir=str(tmp_path / "off"))
    assert allocator.spent["calls"] - calls == 8  # off: not counted
    assert trimmed["params_sha256"] == kept["params_sha256"]


def test_onednns_primitive_cache_is_bounded_unless_the_user_chose_a_capacity():
    """Issue 46 item 4: importing hasfl_ray sets ONEDNN_PRIMITIVE_CACHE_CAPACITY (continuous widths filled oneDNN's
    default 1024 with convolution shapes), leaves a capacity the user set, and every Ray actor gets the same."""
    import os

    code = ("import os, hasfl_ray; from hasfl_ray import allocator; from hasfl_ray.threads import actor_environment; "
            "print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'], actor_environment()"
            "['ONEDNN_PRIMITIVE_CACHE_CAPACITY'], allocator.primitive_cache_status())")
    env = {k: v for k, v in os.environ.items() if k != allocator.PRIMITIVES}
    ours = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert ours.split()[:2] == [str(allocator.PRIMITIVE_CACHE)] * 2 and "at most 256 compiled primitives" in ours
    theirs = subprocess.run([sys.executable, "-c", code], env={**env, allocator.PRIMITIVES: "40"}, capture_output=True,
                            text=True, check=True).stdout
    assert theirs.split()[:2] == ["40", "40"]
    assert allocator.bound_primitive_cache({}) == str(allocator.PRIMITIVE_CACHE)
    assert allocator.bound_primitive_cache({allocator.PRIMITIVES: "7"}) == "7"
