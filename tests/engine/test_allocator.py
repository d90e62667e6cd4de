"""Freed memory handed back after every round (hasfl_ray/allocator.py, issue 46 item 4)."""

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
        allocator.release()
        print(before - rss(), allocator.spent["calls"])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    freed, calls = out.stdout.split()
    assert float(freed) > 100, out.stdout  # about 199 MiB handed back
    assert int(calls) == 1


_BOUNDED = """
import ctypes, os, sys
from hasfl_ray import allocator
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.free(libc.malloc(16 << 20))  # a freed mmapped block raises the threshold: what follows is heap
ballast = [libc.malloc(1 << 20) for _ in range(400)]  # 400 MiB the process holds
for b in ballast:
    ctypes.memset(b, 1, 1 << 20)
def holes(mib):  # mib MiB touched and freed in the middle of the heap (the last block keeps the top busy)
    blocks = [libc.malloc(1 << 20) for _ in range(mib + 1)]
    for b in blocks:
        ctypes.memset(b, 2, 1 << 20)
    for b in blocks[:-1]:
        libc.free(b)
    return blocks[-1]
allocator.release()  # the first request trims
first = allocator.spent["calls"]
kept = [holes(2)]  # 2 MiB of holes: under the bound (1.75 % of ~420 MiB is ~7 MiB)
allocator.release()
small = allocator.spent["calls"]
kept.append(holes(int(sys.argv[1])))  # past the bound
before = allocator.resident()
allocator.release()
print(first, small, allocator.spent["calls"], allocator.spent["requests"], (before - allocator.resident()) >> 20)
"""


@needs_glibc
@pytest.mark.parametrize("variable", ["", "always"])
def test_a_trim_is_made_once_the_heaps_holes_pass_the_bound(variable):
    """Issue 46 item 3: trimming on every request cost a Ray trainer the ~9-10 MiB a digits round regrows, 2,600
    page faults a round; now a request trims only where RSS is more than BOUND above what the process held right
    after its last trim (``HASFL_MALLOC_TRIM=always``: every request, as before)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    if variable:
        env[allocator.VARIABLE] = variable
    out = subprocess.run([sys.executable, "-c", _BOUNDED, "40"], capture_output=True, text=True, check=True, env=env)
    first, small, last, requests, freed = (int(v) for v in out.stdout.split())
    assert (first, requests) == (1, 3), out.stdout
    if variable == "always":
        assert (small, last) == (2, 3), out.stdout
    else:
        assert (small, last) == (1, 2), out.stdout  # 2 MiB of holes kept for the next round; 40 MiB handed back
    assert freed >= 30, out.stdout


@needs_glibc
def test_once_a_round_and_the_same_bits(tmp_path, monkeypatch):
    monkeypatch.setenv(allocator.VARIABLE, "always")
    asked, calls = allocator.spent["requests"], allocator.spent["calls"]
    trimmed = simulate(dataset="digits", rounds=3, clients=6, clients_per_round=3, backend="local",
                       out_dir=str(tmp_path / "on"))
    assert allocator.spent["requests"] - asked == allocator.spent["calls"] - calls == 3
    monkeypatch.setenv(allocator.VARIABLE, "0")
    assert not allocator.enabled()
    kept = simulate(dataset="digits", rounds=3, clients=6, clients_per_round=3, backend="local",
                    out_dir=str(tmp_path / "off"))
    assert allocator.spent["requests"] - asked == allocator.spent["calls"] - calls == 3  # off: no request
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


def test_a_primitive_cache_capacity_that_is_not_a_count_is_replaced_and_info_names_it():
    """h56: ONEDNN_PRIMITIVE_CACHE_CAPACITY=abc was kept (oneDNN's atoi reads it as 0: no cache at all) while
    ``hasfl-ray info`` said "oneDNN keeps at most abc compiled primitives"; now it is replaced by the bound, in this
    process and every Ray actor's environment, and info names the value it replaced."""
    import os

    code = ("import os, hasfl_ray; from hasfl_ray import allocator; from hasfl_ray.threads import actor_environment; "
            "print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'], actor_environment()"
            "['ONEDNN_PRIMITIVE_CACHE_CAPACITY'], allocator.primitive_cache_status())")
    env = {k: v for k, v in os.environ.items() if k != allocator.PRIMITIVES}
    for bad in ("abc", "-5", ""):
        out = subprocess.run([sys.executable, "-c", code], env={**env, allocator.PRIMITIVES: bad},
                             capture_output=True, text=True, check=True).stdout
        assert out.split()[:2] == [str(allocator.PRIMITIVE_CACHE)] * 2, (bad, out)
        assert f"in place of the environment's {bad!r}, which is not a count" in out, out
    environ = {allocator.PRIMITIVES: "abc"}
    assert allocator.bound_primitive_cache(environ) == "256" and environ[allocator.PRIMITIVES] == "256"


@pytest.mark.parametrize("value", ["off", "false", "garbage", "2"])
def test_a_trim_setting_that_is_not_one_is_refused_before_the_run_folder(value, tmp_path, monkeypatch):
    """``HASFL_MALLOC_TRIM=off`` (or any value but always, 0, 1, unset) used to be read as unset: the run trimmed,
    the opposite of what it asked, and ``info`` said it trims. Now the run is refused in one sentence, exit 2, before
    its folder is made, and ``info`` names the value."""
    from tests.cli.sentences import invoke, refused

    monkeypatch.setenv(allocator.VARIABLE, value)
    assert allocator.mode() is None
    out = tmp_path / "run"
    refused(invoke("simulate", "--rounds", 1, "--clients", 4, "--clients-per-round", 2, "--backend", "local",
                   "--quiet", "--out", out), f"HASFL_MALLOC_TRIM is {value!r}", "expected always", "0 (never)")
    assert not out.exists()
    assert f"HASFL_MALLOC_TRIM={value!r} is not a setting" in invoke("info").output


@pytest.mark.parametrize("value, mode", [(" 0 ", "0"), ("ALWAYS", "always"), ("", "1"), ("1", "1")])
def test_the_trim_settings_are_read_with_blanks_and_case_aside(value, mode, monkeypatch):
    monkeypatch.setenv(allocator.VARIABLE, value)
    assert allocator.mode() == mode
    allocator.check_variable()
    assert allocator.enabled() == (mode != "0" and allocator._function() is not None)
