"""``--precision``: the arithmetic of local training's forward pass and loss.

``fp32`` (the default, and every run before the key existed): plain float32, no autocast; results are those of
every earlier version. ``bf16``: the forward and the loss of each local step run under
``torch.autocast(device_type, dtype=torch.bfloat16)`` (convolutions and matmuls in bfloat16 with float32
accumulation, reductions and the cross-entropy in float32, as autocast's op lists decide). Everything else stays
float32: the weights (the "master" copy), their gradients (autograd returns a parameter's gradient in its own
dtype), the clip, the optimiser step, the aggregation, and evaluation (the test accuracy of a bf16 run is that of
its float32 weights, measured as an fp32 run's is, so the two compare directly).

On a CPU bf16 is fast where the cores have bfloat16 dot products (AVX512-BF16, AMX); on a GPU it is the tensor
cores' natural precision. Both are measured in benchmarks/RESULTS.md ("bf16 autocast"); docs/gpu.md says where
each training path uses it.

Paths: one-at-a-time training (eager and the static/graphed step, with the autocast weight-cast cache off, as a
CUDA-graph capture needs) runs under autocast. The batched paths (``--client-batching on`` and ``mixed``,
torch.func over stacked clients) are not: a bf16 trainer trains every client one at a time, whatever
``client_batching`` says (:meth:`~hasfl_ray.training.trainer.Trainer.train_unit`): ``vmap`` of BatchNorm's backward
refuses autocast's bfloat16 activations beside float32 weights, and with BatchNorm in float32 the batched updates
differ from one-at-a-time bf16 ones by as much as bf16 differs from fp32 (docs/gpu.md).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, ContextManager, Optional

import torch


def forward_precision(device: torch.device, precision: str, cache: bool = True) -> ContextManager:
    """The context the forward and loss of a local step run in: nothing for ``fp32``, bfloat16 autocast on
    ``device``'s type for ``bf16`` (``cache=False``: no weight-cast cache, for a CUDA-graph capture)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, cache_enabled=cache)
    raise ValueError(f"precision is {precision!r}; expected fp32 or bf16")


@functools.lru_cache(maxsize=None)
def cpu_runs_bf16_lstm() -> bool:
    """Whether this CPU's oneDNN runs an LSTM under bfloat16 autocast: it has no bf16 LSTM primitive without
    AVX-512 (an AVX2-only CPU such as a Zen 3 raises "could not create a primitive descriptor for the LSTM forward
    propagation primitive"). Tried once on a 1-unit LSTM, its random initialisation outside the global stream."""
    with torch.random.fork_rng(devices=[]):
        lstm = torch.nn.LSTM(1, 1)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lstm(torch.zeros(1, 1, 1))
    except RuntimeError:
        return False
    return True


def check_precision(config: Any, model_name: str) -> None:
    """Refuse, in one sentence and before anything is made, ``precision`` bf16 for a model with an LSTM trained on
    a CPU whose oneDNN has no bfloat16 LSTM (:func:`cpu_runs_bf16_lstm`). A Ray run joining a cluster
    (``address``) is not checked: its trainers run on the nodes' CPUs."""
    if config.precision != "bf16" or config.device != "cpu" or getattr(config, "address", None) is not None:
        return
    from hasfl_ray.errors import ConfigError
    from hasfl_ray.models import build_model

    if cpu_runs_bf16_lstm() or not any(isinstance(m, torch.nn.LSTM) for m in build_model(model_name).modules()):
        return
    raise ConfigError(f"precision is 'bf16' but model {model_name!r} has an LSTM and oneDNN has no bfloat16 LSTM on "
                      f"this CPU ({torch.backends.cpu.get_cpu_capability()}; it needs AVX-512); expected precision "
                      "fp32 here, or a CUDA GPU")


def batching_note(config: Any) -> Optional[str]:
    """The warning line a run logs at its start (the terminal and RUN/log.txt) when ``client_batching`` asks for
    batching (on, mixed) that its trainers will not do: under ``precision`` bf16, or with a local optimiser other
    than the built-in sgd, every client trains one at a time (:meth:`~hasfl_ray.training.trainer.Trainer.train_unit`);
    None otherwise. Results are those of --client-batching off, as config.yaml's value does not say."""
    from hasfl_ray.config.local_optimizer import builtin

    mode = getattr(config, "client_batching", "off")
    if mode not in ("on", "mixed"):
        return None
    if config.precision != "fp32":
        reason, instead = f"precision is {config.precision!r}", "--precision fp32"
    elif not builtin(config.local_optimizer, config.local_optimizer_options):
        options = f" with options {config.local_optimizer_options}" if config.local_optimizer_options else ""
        reason, instead = f"local_optimizer is {config.local_optimizer!r}{options}", "the built-in sgd"
    else:
        return None
    return (f"client_batching is {mode!r} but {reason}, which the batched paths do not run: every client trains one "
            f"at a time, as with --client-batching off (to batch, use {instead})")
