"""Large CPU tensors in transparent huge pages (hasfl_ray/allocator.py; issue 46 item 1): the console script sets
PyTorch's THP_MEM_ALLOC_ENABLE=1 before torch loads unless the user set it, every Ray actor's process starts with
the driver's choice, and with it a large tensor is page-faulted in 2 MiB pages, not 4 KiB ones (what made EMNIST's
full-width test pass spend a third of its CPU time in the kernel)."""

import os
import subprocess
import sys

import pytest

from hasfl_ray import allocator, threads

FAULTS = """
import resource, torch
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
torch.empty(16 * 2 ** 20).fill_(1.0)  # 64 MiB, over glibc's largest mmap threshold: mmapped afresh
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_on_unless_the_user_chose():
    environ = {}
    assert allocator.huge_pages(environ) == "1" and environ == {"THP_MEM_ALLOC_ENABLE": "1"}
    chosen = {"THP_MEM_ALLOC_ENABLE": "0"}
    assert allocator.huge_pages(chosen) == "0" and chosen == {"THP_MEM_ALLOC_ENABLE": "0"}


def test_every_actor_starts_with_the_drivers_choice(monkeypatch):
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    assert threads.actor_environment()["THP_MEM_ALLOC_ENABLE"] == "1"
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "0")
    assert threads.actor_environment()["THP_MEM_ALLOC_ENABLE"] == "0"


def test_a_large_tensor_takes_far_fewer_page_faults_with_huge_pages():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as handle:
            mode = handle.read()
    except OSError:
        pytest.skip("no transparent huge pages on this system (no /sys/kernel/mm/transparent_hugepage)")
    if "[never]" in mode:
        pytest.skip(f"transparent huge pages are off on this system ({mode.strip()})")
    faults = {}
    for value in ("0", "1"):
        env = {**os.environ, "THP_MEM_ALLOC_ENABLE": value}
        done = subprocess.run([sys.executable, "-c", FAULTS], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        faults[value] = int(done.stdout.split()[-1])
    assert faults["0"] >= 16 * 2 ** 20 * 4 // 4096  # one fault a 4 KiB page
    assert faults["1"] < faults["0"] / 4, faults  # 2 MiB pages (the kernel may fall back to small ones for a few)


@pytest.mark.parametrize("given, expected", [(None, "1"), ("0", "0")])
def test_the_console_script_sets_it_before_torch_loads(given, expected):
    code = ("import os, sys\nfrom hasfl_ray.cli import entry\nassert 'torch' not in sys.modules\n"
            "try:\n    entry.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, os.environ.get('THP_MEM_ALLOC_ENABLE'))")
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if given is not None:
        env["THP_MEM_ALLOC_ENABLE"] = given
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["True", expected]


@pytest.mark.parametrize("given, expected", [(None, "transparent huge pages (THP_MEM_ALLOC_ENABLE=1)"),
                                             ("0", "4 KiB pages (THP_MEM_ALLOC_ENABLE=0)")])
def test_info_says_which_pages(given, expected):
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if given is not None:
        env["THP_MEM_ALLOC_ENABLE"] = given
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "hasfl-ray"), "info"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"Large tensors: {expected}" in done.stdout
    assert f"THP_MEM_ALLOC_ENABLE={given or '1'}" in done.stdout  # what every Ray actor starts with
