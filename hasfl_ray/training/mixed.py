"""Mixed-width batched training (``--client-batching mixed``): the clients of several widths trained as one stack,
each padded to the widest width, so one stacked computation per local step serves a whole round's participants
(the protocol's groups per width are small and ragged: 8/5/4/3 clients over 4 widths).

How a client of width p lies in the stack: its packed width-p tensors (its starting point, as
:meth:`~hasfl_ray.training.workspace.Workspace.starting_point` cuts it: the leading slice, or FedRolex's rolling
window already gathered into packed order) are written at the leading indices of every sliced dim of the widest
width's packed shapes, inside each gate block for the LSTM's gate-blocked dim 0
(:func:`~hasfl_ray.models.slicing.region`, the layout aggregation uses), and zeros everywhere else. For a model
whose width-p network is the widest one with zero-padded parameters (:func:`hasfl_ray.models.pads_exactly`: the
CNN, the MLP, the LSTM) the padded channels stay exactly 0 through the forward pass (a zero conv channel is 0 after
batch-statistics BatchNorm with zero weight and bias, ReLU and pooling; a zero LSTM unit keeps c = h = 0) and meet
the kept ones only through zero weights, so every client's loss and gradient on its own coordinates are those of
its width-p network, up to float rounding (sums over more terms, the extra ones zero).

What needs a mask is what is added to the gradient: each client's 0/1 mask (1 on its own coordinates) multiplies
its gradients after the objective's terms are added (FedProx's μ (w − w⁰) and SCAFFOLD's c − c_i, both padded
with zeros too) and before the clip and the SGD step, so a padded coordinate's parameter, momentum buffer and
weight decay stay exactly 0 and the clip's norm is that of the client's own gradients. At the end each client's
trained tensors are cut back to its packed shapes, and its update and extras are computed exactly as for one
width (:func:`~hasfl_ray.training.batched.train_stacked`, shared with :func:`~hasfl_ray.training.batched.
train_batched`). Models whose forward depends on the width (the ResNets' HeteroFL Scaler, GroupNorm; a plug-in
that does not declare ``pads_exactly``) are grouped by width instead (:func:`~hasfl_ray.training.batched.
group_tasks`).
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence, Tuple

import torch

from hasfl_ray.models.slicing import ParamSpec, region
from hasfl_ray.training.batched import Layout, Params, check_batchable, train_stacked
from hasfl_ray.training.result import ClientResult
from hasfl_ray.training.task import ClientTask
from hasfl_ray.training.workspace import Workspace


class Padding(Layout):
    """Clients of ``widths`` in the packed shapes of width ``widest``: each client's coordinates are the leading
    slice of every sliced dim (inside each gate block), the rest zeros; :attr:`masks` holds 1 on them.

    Args:
        specs: the model's slice descriptions (name -> :class:`~hasfl_ray.models.slicing.ParamSpec`).
        widths: each stacked client's width, in stack order.
        widest: the stack's width (at least every client's).
        device, dtype: of the masks (the parameters').
    """

    def __init__(self, specs: Mapping[str, ParamSpec], widths: Sequence[float], widest: float,
                 device: torch.device, dtype: torch.dtype):
        self.blocks = {n: spec.gate_blocks for n, spec in specs.items()}
        self.shapes: Dict[str, Tuple[int, ...]] = {n: spec.sliced_shape(widest) for n, spec in specs.items()}
        self.client_shapes: List[Dict[str, Tuple[int, ...]]] = [
            {n: spec.sliced_shape(float(w)) for n, spec in specs.items()} for w in widths]
        self.masks: Params = {}
        for n, shape in self.shapes.items():
            mask = torch.zeros((len(widths),) + shape, dtype=dtype, device=device)
            for c in range(len(widths)):
                self.region(mask[c], c, n).fill_(1)
            self.masks[n] = mask

    def region(self, tensor: torch.Tensor, c: int, name: str) -> torch.Tensor:
        """The view of client ``c``'s coordinates in ``tensor`` (of the stack's shape of ``name``)."""
        return region(tensor, self.client_shapes[c][name], self.blocks[name])

    def own(self, c: int, stacked: Params) -> Params:
        return {n: self.region(t[c], c, n).reshape(self.client_shapes[c][n]) for n, t in stacked.items()}

    def pad(self, c: int, name: str, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.new_zeros(self.shapes[name])
        self.write_(out, c, name, tensor)
        return out

    def write_(self, out: torch.Tensor, c: int, name: str, tensor: torch.Tensor) -> None:
        """Write client ``c``'s packed ``tensor`` into its coordinates of ``out`` (the stack's shape)."""
        shape = self.client_shapes[c][name]
        if tuple(tensor.shape) != shape:
            raise ValueError(f"client {c}'s {name} has shape {tuple(tensor.shape)}; expected its packed shape "
                             f"{shape}")
        view = self.region(out, c, name)
        view.copy_(tensor.reshape(view.shape))


def train_mixed(workspace: Workspace, tasks: Sequence[ClientTask],
                global_params: Mapping[str, torch.Tensor]) -> List[ClientResult]:
    """Train ``tasks`` (batchable objectives, any widths) as one stack padded to their widest width, on a model
    that pads exactly (:func:`hasfl_ray.models.pads_exactly`); results in task order, without the tasks' testing
    faults. Each result agrees with one-at-a-time training of the task to float rounding, and two calls give
    bit-identical results."""
    if not tasks:
        return []
    workspace = getattr(workspace, "workspace", workspace)
    check_batchable(tasks)
    widths = [float(task.width) for task in tasks]
    if len(set(widths)) > 1 and not workspace.pads_exactly:
        raise ValueError(f"model {workspace.model_name}'s forward depends on its width (it does not pad exactly); "
                         "train its clients of one width together, grouped with group_tasks")
    widest = max(widths)
    workspace.begin()
    initial: Params = {}
    padding = None
    with torch.no_grad():
        for c, task in enumerate(tasks):
            start = workspace.starting_point(task, global_params)
            if padding is None:
                first = next(iter(start.values()))
                padding = Padding(workspace.specs, widths, widest, first.device, first.dtype)
                initial = {n: torch.zeros((len(tasks),) + padding.shapes[n], dtype=t.dtype, device=t.device)
                           for n, t in start.items()}
            for n, tensor in start.items():
                padding.write_(initial[n][c], c, n, tensor)
    masked_labels = workspace.stacked_masked_labels(tasks)
    return train_stacked(workspace, tasks, workspace.model_at(widest), initial, padding, masked_labels)
