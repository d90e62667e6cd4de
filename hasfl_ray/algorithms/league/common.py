"""What the league's methods share: checking a client's mask against the tensor it masks, and the coordinate-wise
mean over the clients that hold each coordinate (HeteroFL's combine generalised from slices to any held set).

Each method's module says how its source weighs the clients (FIARSE: 1 each over non-zero updates; FLuID: n_i;
DepthFL and ScaleFL: 1 each over the clients whose model has the tensor); docs/algorithms.md, "The league's
rules".
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from hasfl_ray.errors import ConfigError


def check_mask(name: str, mask: torch.Tensor, like: torch.Tensor) -> None:
    """Raise ConfigError unless ``mask`` is a bool tensor of ``like``'s shape (the mask of parameter ``name``)."""
    if not isinstance(mask, torch.Tensor):
        raise ConfigError(f"the mask of {name} is a {type(mask).__name__}; expected a bool tensor of shape "
                          f"{tuple(like.shape)}")
    if mask.dtype != torch.bool:
        raise ConfigError(f"the mask of {name} has dtype {mask.dtype}; expected torch.bool (one flag a coordinate)")
    if tuple(mask.shape) != tuple(like.shape):
        raise ConfigError(f"the mask of {name} has shape {tuple(mask.shape)}; expected {tuple(like.shape)}, the "
                          "shape of the parameter it masks")


def masked_mean(base: torch.Tensor, values: Sequence[torch.Tensor], masks: Sequence[torch.Tensor],
                weights: Optional[Sequence[float]] = None, name: str = "the parameter") -> torch.Tensor:
    """The coordinate-wise weighted mean of ``values`` over the clients whose ``masks`` hold each coordinate, in
    float64; ``base`` where no client holds it.

    out[k] = Σ_i w_i m_i[k] v_i[k] / Σ_i w_i m_i[k] where Σ_i w_i m_i[k] > 0, else base[k]. ``values`` are dense
    (full-shape) tensors; what a client does not hold is ignored whatever it contains. ``weights`` default to 1 each.
    """
    if len(values) != len(masks):
        raise ConfigError(f"{len(values)} client tensors came with {len(masks)} masks for {name}; expected one "
                          "mask per client")
    if weights is None:
        weights = [1.0] * len(values)
    if len(weights) != len(values):
        raise ConfigError(f"{len(weights)} weights came for {len(values)} client tensors of {name}; expected one "
                          "weight per client")
    total = torch.zeros(base.shape, dtype=torch.float64)
    mass = torch.zeros(base.shape, dtype=torch.float64)
    for value, mask, weight in zip(values, masks, weights):
        check_mask(name, mask, base)
        if tuple(value.shape) != tuple(base.shape):
            raise ConfigError(f"a client's {name} has shape {tuple(value.shape)}; expected {tuple(base.shape)}")
        if not float(weight) >= 0:
            raise ConfigError(f"a client's weight for {name} is {weight!r}; expected a number >= 0")
        held = mask.to(torch.float64) * float(weight)
        total += held * torch.where(mask, value.to(torch.float64), torch.zeros((), dtype=torch.float64))
        mass += held
    out = base.to(torch.float64).clone()
    covered = mass > 0
    out[covered] = total[covered] / mass[covered]
    return out


__all__ = ["check_mask", "masked_mean"]
