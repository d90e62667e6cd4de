"""Label-split aggregation of the output layer (``classifier_aggregation: label_split``): HeteroFL's and FedRolex's
``Federation.combine`` (HeteroFL src/fed.py), where row k of the classifier's weight and bias is averaged over only
the round's clients holding label k.

The source, for the output weight (its bias alike, without the column index)::

    label_split = self.label_split[user_idx[m]]
    param_idx[m][k][0] = param_idx[m][k][0][label_split]
    tmp_v[torch.meshgrid(param_idx[m][k])] += local_parameters[m][k][label_split]
    count[k][torch.meshgrid(param_idx[m][k])] += 1
    ...
    tmp_v[count[k] > 0] = tmp_v[count[k] > 0].div_(count[k][count[k] > 0])
    v[count[k] > 0] = tmp_v[count[k] > 0].to(v.dtype)

so a coordinate (k, j) is the mean over the clients that hold label k and cover column j, and one no such client
covers keeps the global value. Here the count is the round's weight (``aggregation_weights: count``, or heterofl's
``heterofl_weighting: count``, gives the source's 1 a client; samples n_i otherwise), the mean is of the updates Δ_i
(w + Δ̄ with η_g = 1 is the mean of the local models), and an uncovered coordinate gets Δ̄ = 0: the global value is
kept. Every other parameter is the
fused kernel's mean (:func:`hasfl_ray.aggregation.aggregate_updates`, or its windows for FedRolex).

The divergence norms keep the paper's Eq. 5 with m_i client i's own coordinates (all rows of the output layer it
trained) and Δ̄ the aggregate applied: on the output layer ||m_i ⊙ (Δ_i − Δ̄)||² and ||m_i ⊙ Δ̄||² against the
label-split mean (0 on rows no holder covers), in float64 with the unrounded mean as the kernel computes its own.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from hasfl_ray.aggregation import aggregate_updates, validate_inputs
from hasfl_ray.aggregation.result import AggregateResult
from hasfl_ray.aggregation.windows import aggregate_windows
from hasfl_ray.errors import ConfigError
from hasfl_ray.models.slicing import ParamSpec, gate_blocks_of, window_linear_index

#: The values of ``classifier_aggregation``: all (every covering client, the default) or label_split.
CLASSIFIER_AGGREGATIONS = ("all", "label_split")


def client_label_masks(dataset: Any) -> np.ndarray:
    """Per client, the labels it holds, bool (clients, classes): the partition's label split where it deals one
    (``classes:K``; HeteroFL's ``non_iid``), else the labels of its training samples (``label_histograms() > 0``;
    HeteroFL's ``iid``: ``torch.unique`` of its labels)."""
    split = getattr(dataset, "label_split", None)
    if split is None:
        return np.asarray(dataset.label_histograms()) > 0
    masks = np.zeros((len(split), int(dataset.num_classes)), dtype=bool)
    for client, labels in enumerate(split):
        masks[client, list(labels)] = True
    return masks


def output_layer(specs: Mapping[str, ParamSpec], classes: int, model: str = "the model") -> Tuple[str, ...]:
    """The output layer's parameter names, (weight,) or (weight, bias), by HeteroFL's rule for its models (the last
    parameter named ``*weight``, and its bias): dim 0 of each unscaled, one row a class; else one sentence."""
    weight = next((name for name in reversed(list(specs)) if name.endswith("weight")), None)
    bias = None if weight is None else weight[:-len("weight")] + "bias"
    names = () if weight is None else (weight, bias) if bias in specs else (weight,)
    for name in names:
        dims = specs[name].dims
        if len(dims) != (2 if name == weight else 1) or dims[0].scaled or dims[0].size != classes:
            names = ()
    if not names:
        found = f"its last weight {weight!r} has shape {specs[weight].shape}" if weight else "it has no weight"
        raise ConfigError(f"classifier_aggregation is 'label_split' but {model}'s output layer was not found ({found}"
                          f"); expected a last parameter named *weight of shape ({classes}, features), one unscaled "
                          f"row per class, and optionally its *bias of shape ({classes},)")
    return names


def label_masks_for(config: Any, dataset: Any, model_name: str) -> Optional[np.ndarray]:
    """What the server's ``label_masks`` is for a run: None with ``classifier_aggregation: all``, else
    :func:`client_label_masks`, once the model's output layer is found (one sentence if not, before any actor)."""
    if getattr(config, "classifier_aggregation", "all") != "label_split":
        return None
    from hasfl_ray.models import build_model, register_model

    masks = client_label_masks(dataset)
    register_model(model_name, getattr(dataset, "model_config", None))
    output_layer(build_model(model_name).param_specs(), masks.shape[1], repr(model_name))
    return masks


def aggregate_label_split(specs: Mapping[str, ParamSpec], updates: Sequence[Mapping[str, torch.Tensor]],
                          offsets: Sequence[int], weights: Sequence[float], holds: np.ndarray,
                          output: Sequence[str], backend: str = "auto") -> AggregateResult:
    """The round's aggregate with the ``output`` parameters averaged by label split (module docstring).

    Args:
        specs: parameter name -> slice description of the full model.
        updates, offsets, weights: the accepted clients' packed updates, window offsets and weights, in order.
        holds: bool (clients, classes), row i the labels client i holds.
        output: the output layer's names (:func:`output_layer`).
        backend: the kernel's backend for every other parameter.

    Returns:
        :class:`AggregateResult` whose ``covered_by_layer`` holds the output layer's covered fractions (the
        coordinates some holder covers).
    """
    rest = {name: spec for name, spec in specs.items() if name not in output}
    rest_updates = [{name: t for name, t in update.items() if name not in output} for update in updates]
    outputs = [{name: update[name] for name in output if name in update} for update in updates]
    if any(outputs):  # the output layer's tensors, checked as the kernel checks its own (one sentence)
        validate_inputs({name: specs[name].shape for name in output}, outputs, weights, {})
    if any(rest_updates):
        if any(offsets):
            result = aggregate_windows(rest, rest_updates, offsets, weights, backend=backend)
        else:
            result = aggregate_updates({name: spec.shape for name, spec in rest.items()}, rest_updates, weights,
                                       gate_blocks_of(rest), backend=backend)
    else:  # a model whose every trained parameter is the output layer
        zeros = torch.zeros(len(updates), dtype=torch.float64)
        result = AggregateResult({}, zeros, zeros.clone(), 0.0)
    first = next(t for update in updates for t in update.values())
    w64 = [float(w) for w in torch.as_tensor(weights, dtype=torch.float64).flatten()]
    held = torch.as_tensor(np.asarray(holds, dtype=bool), device=first.device)
    div_num, div_den = result.div_num.clone(), result.div_den.clone()
    delta: Dict[str, torch.Tensor] = {}
    rest_total = sum(spec.numel() for spec in rest.values())
    covered, total, by_layer = round(result.covered_fraction * rest_total), rest_total, {}
    for name in output:
        spec = specs[name]
        numerator = torch.zeros(spec.shape, dtype=torch.float64, device=first.device)
        denominator = torch.zeros(spec.shape, dtype=torch.float64, device=first.device)
        positions = {}
        for i, update in enumerate(outputs):
            packed = update.get(name)
            if packed is None:
                continue
            flat = window_linear_index(spec, packed.shape, offsets[i], first.device)
            rows = held[i].view((-1,) + (1,) * (packed.dim() - 1)).expand(packed.shape)
            positions[i] = flat
            numerator.view(-1).index_add_(0, flat[rows], packed[rows].to(torch.float64), alpha=w64[i])
            denominator.view(-1).index_add_(0, flat[rows], torch.full_like(flat[rows], 1, dtype=torch.float64),
                                            alpha=w64[i])
        mask = denominator > 0
        mean = torch.where(mask, numerator / torch.where(mask, denominator, 1), 0)
        delta[name] = mean.to(first.dtype)
        for i, flat in positions.items():
            at = mean.view(-1)[flat]
            div_num[i] += (outputs[i][name].to(torch.float64) - at).square().sum().cpu()
            div_den[i] += at.square().sum().cpu()
        covered, total = covered + int(mask.sum()), total + mean.numel()
        by_layer[name] = int(mask.sum()) / mean.numel()
    merged = {name: delta[name] if name in delta else result.delta[name] for name in specs
              if name in delta or name in result.delta}
    return AggregateResult(merged, div_num, div_den, covered / total if total else 0.0, by_layer)


def split_by_label(specs: Mapping[str, ParamSpec], updates: Sequence[Mapping[str, torch.Tensor]],
                   offsets: Sequence[int], holds: np.ndarray, output: Sequence[str]
                   ) -> Tuple[List[Dict[str, object]], List[Tuple[int, Dict[str, object]]]]:
    """The label split as masks, for the fused DP pass (:func:`hasfl_ray.ops.aggregate_private.
    aggregate_private_sparse`): each client's ``output`` parameters become the :class:`~hasfl_ray.aggregation.
    packed.MaskedUpdate` of the coordinates :func:`aggregate_label_split` averages it over (its slice or window, rows
    of the labels it holds), and the rest of its packed values, rows of labels it does not hold, is returned aside
    (client, its masked values): in its norm (:func:`hasfl_ray.aggregation.privacy.update_norm` is over every packed
    value) and its divergence norms (over all its own coordinates, module docstring), in no mean. Values in the
    full tensor's row-major order (a rolled window's are reordered). Other parameters are passed as they are."""
    from hasfl_ray.aggregation.packed import MaskedUpdate, pack_bits

    held = torch.as_tensor(np.asarray(holds, dtype=bool))
    split: List[Dict[str, object]] = []
    aside: List[Tuple[int, Dict[str, object]]] = []
    for i, update in enumerate(updates):
        mine, rest = dict(update), {}
        for name in output:
            packed = update.get(name)
            if packed is None:
                continue
            spec = specs[name]
            flat = window_linear_index(spec, packed.shape, offsets[i], packed.device)
            rows = held[i].to(packed.device).view((-1,) + (1,) * (packed.dim() - 1)).expand(packed.shape)
            parts = []
            for part in (rows, ~rows):
                positions, values = flat[part], packed[part]
                order = torch.argsort(positions)
                mask = torch.zeros(spec.numel(), dtype=torch.bool)
                mask[positions.cpu()] = True
                parts.append(MaskedUpdate(values[order].contiguous(), pack_bits(mask)))
            mine[name] = parts[0]
            if parts[1].values.numel():
                rest[name] = parts[1]
        split.append(mine)
        if rest:
            aside.append((i, rest))
    return split, aside


__all__ = ["CLASSIFIER_AGGREGATIONS", "aggregate_label_split", "client_label_masks", "label_masks_for",
           "output_layer", "split_by_label"]
