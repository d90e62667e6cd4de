"""ScaleFL (Ilhan et al., CVPR 2023): width and depth scaled together per level, early exits and self-distillation,
as git-disl/scale-fl's code computes it.

Source: github.com/git-disl/scale-fl, commit c2084e461cef83751b99a958198aced66c1d7d7c: ``args.py`` (the levels'
defaults), ``fed.py::Federator`` (``fed_train``: the clients' levels; ``execute_round``; ``average_weights``),
``train.py::execute_epoch`` (the loss), ``models/model_utils.py::KDLoss``, ``models/resnet.py`` (``int(C · scale)``
channels, ``Scaler``, the exits), ``utils/grad_traceback.py::filter`` (the kept channels: the leading ones).

The rule, read from that code:

- **Levels.** Level ℓ has a width scale v_ℓ (``--vertical_scale_ratios``, default 0.7 0.7 0.75 1) and a number of
  exits h_ℓ (``--horizontal_scale_ratios``, default 1 2 3 4): its model is the global one cut to the leading
  ``int(C · v_ℓ)`` channels of every layer (``Scaler``: x / v_ℓ before every norm) and run to its h_ℓ-th exit (the
  blocks after it are not run, so they get no gradient). Clients are assigned levels once: a permutation of the
  client ids drawn with ``np.random.seed(seed)``, cut into consecutive groups of ``int(N · r_ℓ)``
  (``--client_split_ratios``, default 0.25 each). A client left over by the truncation has no group: ``get_level``
  answers −1 (its comment says "client will be skipped"), but ``execute_round`` indexes the levels' widths, exits
  and coordinates with it, so it trains, and is averaged, as the last level (:func:`trained_level`).
- **Loss** of a batch with exits' logits f_1 .. f_n (n = h_ℓ): Σ_j (j + 1) · L_j / (n (n + 1) / 2) with
  L_n = CE(f_n, y) and, for j < n, L_j = CE(f_j, y) + γ T² · KLDivLoss()(log_softmax(f_j / T), softmax(f_n / T)) when
  γ ≠ 0 and the round index (0-based) exceeds 0.25 · rounds, else CE alone. ``nn.KLDivLoss()``'s default reduction is
  the mean over every element (batch × classes), not over the batch; the teacher f_n is *not* detached, so the
  distillation term also trains the deepest exit toward the shallow ones. γ (``--KD_gamma``) defaults to 0 (no
  distillation) and T (``--KD_T``) to 3; the README's BERT runs use γ = 0.05.
- **Aggregation** (``average_weights``): per tensor, the unweighted mean over the clients whose copy of it received a
  gradient, each client's values placed at its level's coordinates; a coordinate no such client holds keeps the global
  value; running statistics are the plain mean over all clients; ``num_batches_tracked`` the first client's.
- **Evaluation** (``predict.py::validate``): the reported top-1 is the mean of the exits' accuracies (one
  ``AverageMeter`` object repeated over the exits, :func:`reported_top1`), for the global model over all its exits
  and for a level over its exits 1..h_ℓ.

hasfl-ray's nested slices are ceil(p · C); ScaleFL's are int(v · C) (floor): :func:`scaled_channels` keeps the
source's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Sequence

import numpy as np
import torch
from torch.nn import functional as F

from hasfl_ray.algorithms.league.common import masked_mean
from hasfl_ray.algorithms.options import FLOAT32_MAX, check_range
from hasfl_ray.errors import ConfigError
from hasfl_ray.models.resnet import RESNETS


#: ``scalefl_exit_head``'s values: the source's ``Classifier``, or DepthFL's exits (hasfl_ray.models.depth_heads).
EXIT_HEAD_CHOICES = {"source": "scalefl", "depthfl": "depthfl"}
#: The models whose exits have heads to choose (the ResNets; the image CNNs' exits are a pool and a linear layer).
EXIT_HEAD_MODELS = tuple(RESNETS)


def parse_exits(text: str) -> List[int]:
    """The exits of each level from ``"1,2,3,4"``: positive whole numbers, non-decreasing."""
    try:
        exits = [int(part) for part in str(text).split(",")]
    except ValueError:
        exits = []
    if not exits or any(e < 1 for e in exits) or exits != sorted(exits):
        raise ConfigError(f"scalefl_exits is {text!r}; expected comma-separated numbers of exits per level, each >= 1 "
                          "and non-decreasing (ScaleFL's default 1,2,3,4), or auto")
    return exits


@dataclass
class ScaleFLOptions:
    # exits per level, shallowest level first (--horizontal_scale_ratios); "auto": ceil(v x stages) per ladder width v,
    # the source's 1,2,3,4 on a four-stage ResNet with the four-width ladder (hasfl_ray/algorithms/scalefl.py)
    scalefl_exits: str = "auto"
    scalefl_kd_gamma: float = 0.0  # weight of the distillation term (--KD_gamma; 0 = CE alone, the source's default)
    scalefl_kd_temperature: float = 3.0  # T (--KD_T)
    scalefl_kd_start: float = 0.25  # distillation from round index > this fraction of the rounds
    # a ResNet's exits: source, the source's Classifier (hasfl_ray/models/depth_heads.py); depthfl, DepthFL's heads
    scalefl_exit_head: str = field(default="source", metadata={"choices": tuple(EXIT_HEAD_CHOICES)})

    def __post_init__(self) -> None:
        if self.scalefl_exits != "auto":
            parse_exits(self.scalefl_exits)
        if self.scalefl_exit_head not in EXIT_HEAD_CHOICES:
            raise ConfigError(f"scalefl_exit_head is {self.scalefl_exit_head!r}; expected source (ScaleFL's own "
                              "Classifier after each exit's stage) or depthfl (DepthFL's bottleneck exits)")
        check_range("scalefl_kd_gamma", self.scalefl_kd_gamma, 0, FLOAT32_MAX, "a number >= 0")
        check_range("scalefl_kd_temperature", self.scalefl_kd_temperature, 0, FLOAT32_MAX, "a temperature > 0",
                    low_open=True)
        check_range("scalefl_kd_start", self.scalefl_kd_start, 0, 1, "a fraction of the rounds in [0, 1]")

    def inert(self, config):
        """The distillation's temperature and start with its weight 0 (the default: the exits' CE alone)."""
        inert = {}
        model = config.get("model")
        if model not in EXIT_HEAD_MODELS:  # the image CNNs' exits are a pool and a linear layer, with no head
            inert["scalefl_exit_head"] = (
                "model is unset (the image CNN's exits have no heads)" if model is None else
                f"model {model!r} is not a ResNet (no exit heads)",
                f"--model {', '.join(EXIT_HEAD_MODELS[:-1])} or {EXIT_HEAD_MODELS[-1]}")
        if self.scalefl_kd_gamma:
            return inert
        why = ("scalefl_kd_gamma is 0 (no distillation, the default)", "scalefl_kd_gamma > 0")
        return {**inert, "scalefl_kd_temperature": why, "scalefl_kd_start": why}


def level_groups(num_clients: int, split_ratios: Sequence[float], seed: int) -> List[np.ndarray]:
    """``fed_train``'s groups: a permutation drawn after ``np.random.seed(seed)``, cut into ``int(N · r)`` runs."""
    shuffled = np.random.RandomState(seed).permutation(np.arange(num_clients))
    groups, start = [], 0
    for ratio in split_ratios:
        end = start + int(len(shuffled) * ratio)
        groups.append(shuffled[start:end])
        start = end
    return groups


def level_of(client: int, groups: Sequence[np.ndarray]) -> int:
    """The level of ``client`` (0 the first), or −1 when it has none, as ``get_level`` answers (not skipped: see
    :func:`trained_level`)."""
    for level, group in enumerate(groups):
        if client in group:
            return level
    return -1


def trained_level(client: int, groups: Sequence[np.ndarray]) -> int:
    """The level whose width, exits and coordinates ``client`` trains with (0 the first): its own, and for a client
    in no group the last one, since ``execute_round`` reads ``vertical_scale_ratios[level]``,
    ``horizontal_scale_ratios[level]`` and ``idx_dicts[level]`` with ``get_level``'s −1."""
    level = level_of(client, groups)
    return len(groups) - 1 if level == -1 else level


def scaled_channels(channels: int, scale: float) -> int:
    """int(C · scale): the channels a level keeps (the leading ones)."""
    return channels if scale == 1 else int(channels * scale)


def leading_mask(global_shape: Sequence[int], local_shape: Sequence[int]) -> torch.Tensor:
    """The coordinates of a level's tensor in the global one: the leading ``local_shape`` block."""
    if len(global_shape) != len(local_shape) or any(l > g for l, g in zip(local_shape, global_shape)):
        raise ConfigError(f"a level's tensor of shape {tuple(local_shape)} does not fit in the global "
                          f"{tuple(global_shape)}; expected as many dims, none larger")
    mask = torch.zeros(tuple(global_shape), dtype=torch.bool)
    mask[tuple(slice(0, n) for n in local_shape)] = True
    return mask


def distillation_active(round_index: int, num_rounds: int, start: float = 0.25) -> bool:
    """``gamma_active = round > args.num_rounds * 0.25`` (round 0-based)."""
    return round_index > num_rounds * start


def kl_elementwise_mean(pred: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """``nn.KLDivLoss()(log_softmax(pred / T), softmax(teacher / T))`` with the source's reduction ``'mean'``: the
    sum over every element divided by batch × classes (written out, since PyTorch plans to make ``'mean'`` act as
    ``'batchmean'``)."""
    log_p = F.log_softmax(pred / temperature, dim=1)
    return F.kl_div(log_p, F.softmax(teacher / temperature, dim=1), reduction="sum") / log_p.numel()


def exit_loss(outputs: Sequence[torch.Tensor], target: torch.Tensor, gamma: float = 0.0, temperature: float = 3.0,
              active: bool = True) -> torch.Tensor:
    """``execute_epoch``'s loss over the exits' logits (shallowest first), normalised by n (n + 1) / 2."""
    n = len(outputs)
    loss = torch.zeros((), dtype=outputs[-1].dtype)
    for j, out in enumerate(outputs):
        if j == n - 1:
            loss = loss + F.cross_entropy(out, target) * (j + 1)
            continue
        term = F.cross_entropy(out, target)
        if gamma and active:  # the teacher outputs[-1] is not detached, as in the source
            term = term + kl_elementwise_mean(out, outputs[-1], temperature) * gamma * temperature ** 2
        loss = loss + term * (j + 1)
    return loss / (n * (n + 1) / 2)


def reported_top1(batches: Sequence[Sequence[torch.Tensor]], targets: Sequence[torch.Tensor]) -> float:
    """The top-1 (in %) ``predict.py::validate`` reports for one model over ``batches`` (each the exits' logits,
    shallowest first): its meters are ``[AverageMeter()] * num_exits``, one object repeated, so every exit's batch
    accuracy lands in the same meter and the figure is the mean of the exits' accuracies, not the deepest exit's."""
    total = count = 0.0
    for outputs, target in zip(batches, targets):
        for out in outputs:
            total += 100.0 * (out.argmax(1) == target).sum().item()
            count += target.numel()
    return total / count


def aggregate(global_params: Mapping[str, torch.Tensor], clients: Sequence[Mapping[str, torch.Tensor]],
              trained: Sequence[Mapping[str, bool]]) -> Dict[str, torch.Tensor]:
    """``average_weights``: per tensor the count mean over the clients whose copy got a gradient (``trained``), at
    their leading block; running statistics the mean over all; ``num_batches_tracked`` the first client's."""
    out = {}
    for name, value in global_params.items():
        if "num_batches_tracked" in name:
            out[name] = clients[0][name].clone()
            continue
        if "running" in name:
            out[name] = (sum(c[name].to(torch.float64) for c in clients) / len(clients)).to(value.dtype)
            continue
        values, masks = [], []
        for client, flags in zip(clients, trained):
            if flags.get(name, False):
                local = client[name]
                mask = leading_mask(value.shape, local.shape)
                full = torch.zeros(value.shape, dtype=local.dtype)
                full[mask] = local.reshape(-1)
                values.append(full)
                masks.append(mask)
        out[name] = masked_mean(value, values, masks, None, name).to(value.dtype)
    return out


__all__ = ["ScaleFLOptions", "aggregate", "distillation_active", "exit_loss", "kl_elementwise_mean", "leading_mask",
           "level_groups", "level_of", "parse_exits", "reported_top1", "scaled_channels",
           "trained_level"]
