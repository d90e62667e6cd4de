"""Accuracy at each depth of a run with depth sub-models (docs/models.md#depth-sub-models): the global model's
depth-d sub-model at full width (its first d stages and exit d's logits), evaluated on the server's test samples in
its batches, as the accuracy at each width is (``accuracy_at_depth`` of metrics.jsonl, DepthFL's per-classifier
accuracy).

Beside widths, the server's width models (:meth:`Server.width_model`, hence ``evaluate_widths`` and ``test_beats``)
take *shapes*: a width w (the whole network's width-w slice), a pair (w, d) (the width-w slices of the depth-d
sub-model, its exit d: what a client of a width_depth run trains, ScaleFL's level) or :data:`ENSEMBLE` (the full
network answering with the mean of its exits' logits, DepthFL's global prediction)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from hasfl_ray.models import build_model
from hasfl_ray.models.resnet import sbn_statistics
from hasfl_ray.engine.statistics import pass_batches
from hasfl_ray.training.evaluate import evaluate


@torch.no_grad()
def evaluate_depths(server, depths: Sequence[int]) -> Dict[int, Tuple[float, float]]:
    """(accuracy, loss) of ``server``'s global model cut to each depth of ``depths`` (a :class:`Server`), its sBN
    statistics from the server's pass where it has static BatchNorm."""
    out = {}
    for depth in depths:
        model = build_model(server.model_name, 1.0, int(depth)).to(server.device)
        for name, param in model.named_parameters():
            param.copy_(server.params[name])
        if server.statistics.mode != "test_batch":
            sbn_statistics(model, pass_batches(server.dataset, server.statistics))
        out[int(depth)] = evaluate(model, server.dataset, server.eval_batch_size, server.eval_indices)
    return out


#: The shape of DepthFL's global prediction: the full network, the mean of its exits' logits.
ENSEMBLE = "ensemble"

Shape = Union[float, Tuple[float, int], str]


def shape_width(shape: Shape) -> float:
    """The width whose slices a shape's parameters are."""
    return 1.0 if shape == ENSEMBLE else float(shape[0]) if isinstance(shape, tuple) else float(shape)


def shape_model(model_name: str, shape: Shape) -> nn.Module:
    """The network of ``shape``: ``build_model`` at its width (and depth); the ensemble's forward is the mean of its
    exits' logits (:func:`hasfl_ray.models.depth.ensemble`)."""
    if isinstance(shape, tuple):
        return build_model(model_name, float(shape[0]), int(shape[1]))
    if shape != ENSEMBLE:
        return build_model(model_name, float(shape))
    from hasfl_ray.models.depth import ensemble

    model = build_model(model_name)
    model.forward = lambda x: ensemble(model.forward_exits(x))  # an instance's own forward: nn.Module calls it
    return model


def eval_shape(plan, width: float) -> Shape:
    """The shape a client allocated ``width`` trains under the depth plan ``plan`` (None: ``width`` itself): its
    (trained width, depth), or the trained width alone where the depth is the whole network's."""
    if plan is None:
        return width
    trained, depth = plan.shape(width)
    return trained if depth is None or depth == plan.num_depths else (trained, int(depth))


def evaluated_network(algorithm: Any, model_name: str, params: Dict[str, torch.Tensor], width: float) -> nn.Module:
    """The network whose accuracy a run records at ``width`` (``accuracy_at_width``; width 1: ``test_accuracy``),
    holding ``params`` (the global model, full width) as the run's evaluation cuts them: DepthFL's ensemble of exits
    at width 1, a depth sub-model's (width, depth) shape (:func:`eval_shape`), a plug-in's or FIARSE's own
    ``submodel_for_eval`` (full shapes, masked), else the nested prefix. ``algorithm``: the run's
    :class:`~hasfl_ray.engine.guard.GuardedAlgorithm` (``depth_plan`` set). No sBN statistics pass is made."""
    from hasfl_ray.models import extract

    plan = getattr(algorithm, "depth_plan", None)
    if float(width) == 1.0:
        shape: Shape = ENSEMBLE if getattr(algorithm, "global_ensemble", False) else 1.0
    else:
        shape = eval_shape(plan, float(width))
    specs = build_model(model_name).param_specs()
    values = None
    if plan is None and shape != 1.0 and algorithm.overrides_submodel_for_eval:
        values = algorithm.submodel_for_eval(params, float(width), {n: s.sliced_shape(float(width))
                                                                    for n, s in specs.items()})
    masked = values is not None and all(tuple(values[n].shape) == spec.shape for n, spec in specs.items())
    network = shape_model(model_name, 1.0 if masked else shape)
    with torch.no_grad():
        for name, param in network.named_parameters():
            param.copy_(values[name] if values is not None else extract(params[name], specs[name], shape_width(shape)))
    return network


def shape_key(shape: Optional[Shape]) -> str:
    """How a shape is named in sentences and logs: "0.5", "0.5@d1", "ensemble"."""
    if isinstance(shape, tuple):
        return f"{float(shape[0]):g}@d{int(shape[1])}"
    return str(shape) if shape == ENSEMBLE else f"{float(shape):g}"


__all__ = ["ENSEMBLE", "eval_shape", "evaluated_network", "evaluate_depths", "shape_key", "shape_model", "shape_width"]
