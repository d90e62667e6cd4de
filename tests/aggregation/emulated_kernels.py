"""The CUDA ops' kernels built to run on the CPU (cuda_emulation/: emulate_cuda.h's fibers for a block's threads,
kernels_emulated.cpp's ops), once per test session: what the CUDA-emulation tests call in place of a card."""

import functools
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent / "cuda_emulation"

needs_compiler = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None,
                                    reason="needs a C++ compiler to build the CUDA emulation")


@functools.lru_cache(maxsize=None)
def emulated():
    """The extension: aggregate_into(out, packed, params, entries, weights, blocks) and
    aggregate_sparse_into(kernel, out, packed, params, entries, weights, kinds, bits, rows, row_offsets)."""
    import torch
    from torch.utils.cpp_extension import load

    # One build folder per checkout, Python and torch, reused from run to run (ninja rebuilds what changed).
    key = hashlib.sha256(f"{ROOT}|{sys.version}|{torch.__version__}".encode()).hexdigest()[:16]
    build = os.path.join(tempfile.gettempdir(), f"hasfl_emulated_{key}")
    os.makedirs(build, exist_ok=True)
    return load(name="hasfl_kernels_emulated", sources=[str(HERE / "kernels_emulated.cpp")],
                extra_include_paths=[str(ROOT / "csrc"), str(HERE)], extra_cflags=["-O1", "-std=c++20"],
                build_directory=build, verbose=False)
