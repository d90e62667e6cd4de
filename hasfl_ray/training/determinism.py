"""Deterministic torch settings for every process that trains or aggregates (driver, trainers, server).

On CUDA, bit-identical runs need four things set before CUDA does its first cuBLAS/cuDNN work:
``CUBLAS_WORKSPACE_CONFIG`` (cuBLAS picks reduction orders per stream otherwise), deterministic algorithms,
cuDNN's deterministic kernels, and no cuDNN autotuning (``benchmark`` picks kernels by timing, so two runs may
pick two). On CPU only the deterministic-algorithms switch matters. ``deterministic=False`` (the CLI's
``--fast-nondeterministic``) lets cuDNN autotune and torch use its fastest (atomic-add) kernels instead.

Exact float32, too: the deterministic mode turns TensorFloat-32 off for cuDNN (convolutions, RNNs) and cuBLAS
matmuls. cuDNN's default on Ampere and Hopper is TF32 convolutions, which round inputs to 10 mantissa bits; then a
batched and a one-at-a-time computation of one client differ by ~5e-3 relative (measured on an H200, issue 17),
and only the order of float32 operations should separate them. ``--fast-nondeterministic`` restores torch's own
defaults (TF32 cuDNN convolutions and RNNs, full-precision matmuls). The CPU is unaffected either way.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Dict

import torch

logger = logging.getLogger(__name__)

#: The cuBLAS workspace setting that makes its results reproducible (documented by NVIDIA and PyTorch).
CUBLAS_WORKSPACE = ":4096:8"
#: Workspace settings cuBLAS accepts as deterministic (a user's own choice of either is kept).
DETERMINISTIC_WORKSPACES = (":4096:8", ":16:8")


def apply_determinism(deterministic: bool = True) -> Dict[str, Any]:
    """Put this process's torch into deterministic (or fast) mode; returns :func:`determinism_state`.

    Call it before the process first uses CUDA: the cuBLAS workspace is read when cuBLAS starts. Calling it
    again is harmless. A process whose cuBLAS already started without the setting gets a warning.

    Args:
        deterministic: True for bit-identical results (the default), False for cuDNN autotuning and
            nondeterministic kernels.
    """
    if deterministic:
        if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in DETERMINISTIC_WORKSPACES:
            if _cuda_started():
                logger.warning("CUDA started before CUBLAS_WORKSPACE_CONFIG was set: cuBLAS results of this process "
                               "may differ run to run; set CUBLAS_WORKSPACE_CONFIG=%s before starting it",
                               CUBLAS_WORKSPACE)
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
        # warn_only: an op without a deterministic kernel warns instead of ending a long run.
        _deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    else:
        _deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
        torch.backends.cudnn.benchmark = True
    set_tf32(not deterministic)
    return determinism_state()


def _deterministic_algorithms(mode: bool, warn_only: bool = False) -> None:
    """``torch.use_deterministic_algorithms(mode)`` without importing torch._inductor (1.5 s of CPU in every process,
    the driver's and each actor's, for a compiler the package never calls): torch's function sets the same
    switch, and Inductor's ``deterministic`` config, which reads TORCHINDUCTOR_DETERMINISTIC when it is first
    imported; set here once it is."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)  # private: another torch may lack it
    if setter is None or "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
        return
    os.environ["TORCHINDUCTOR_DETERMINISTIC"] = "1" if mode else "0"
    setter(mode, warn_only=warn_only)


#: (matmul, cuDNN) float32 precision: exact IEEE float32, or torch's defaults (TF32 cuDNN, full matmul).
_EXACT, _TORCH_DEFAULTS = ("ieee", "ieee"), ("none", "tf32")


def set_tf32(allowed: bool) -> None:
    """TF32 off (``allowed=False``: exact float32 in cuBLAS matmuls and cuDNN convolutions and RNNs) or torch's
    defaults. Uses torch's ``fp32_precision`` switches where they exist (torch >= 2.9: mixing them with the legacy
    ``allow_tf32`` flags makes torch raise on later reads), else the legacy flags."""
    matmul, cudnn = _TORCH_DEFAULTS if allowed else _EXACT
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = matmul
        torch.backends.cudnn.conv.fp32_precision = cudnn
        torch.backends.cudnn.rnn.fp32_precision = cudnn
    else:  # older torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = allowed


def tf32_state() -> Dict[str, bool]:
    """Whether this process lets cuBLAS matmuls and cuDNN convolutions / RNNs use TF32."""
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        matmul = torch.backends.cuda.matmul.fp32_precision == "tf32"
        return {"matmul_tf32": matmul, "cudnn_conv_tf32": torch.backends.cudnn.conv.fp32_precision == "tf32",
                "cudnn_rnn_tf32": torch.backends.cudnn.rnn.fp32_precision == "tf32"}
    cudnn = bool(torch.backends.cudnn.allow_tf32)
    return {"matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32), "cudnn_conv_tf32": cudnn,
            "cudnn_rnn_tf32": cudnn}


def determinism_state() -> Dict[str, Any]:
    """This process's settings that decide whether CUDA results repeat bit for bit (JSON-ready)."""
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    algorithms = torch.are_deterministic_algorithms_enabled()
    cudnn_deterministic = bool(torch.backends.cudnn.deterministic)
    cudnn_benchmark = bool(torch.backends.cudnn.benchmark)
    tf32 = tf32_state()
    return {
        "deterministic": bool(algorithms and cudnn_deterministic and not cudnn_benchmark
                              and workspace in DETERMINISTIC_WORKSPACES and not any(tf32.values())),
        "exact_float32": not any(tf32.values()),
        **tf32,
        "deterministic_algorithms": algorithms,
        "cudnn_deterministic": cudnn_deterministic,
        "cudnn_benchmark": cudnn_benchmark,
        "cublas_workspace_config": workspace,
        "cuda_initialized": _cuda_started(),
    }


def _cuda_started() -> bool:
    return bool(torch.cuda.is_initialized())


def machine_type() -> Dict[str, str]:
    """What decides the last bits of a CPU run beside the settings above: the processor model, the instruction set
    torch dispatches to and the torch build (bit-identity holds on one machine type; a recorded hash is compared
    only where these match)."""
    import platform

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), model)
    except OSError:
        pass
    return {"cpu_model": model, "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}
