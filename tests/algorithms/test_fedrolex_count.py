"""FedRolex's ``combine`` counts each client once (``aggregation_weights: count``), checked against the source's
expression written out here:

    github.com/AIoT-MLSys-Lab/FedRolex, resnet_server.py (commit 704079d9b9466b4e6b74f1ef6492d7e534f25986),
    ``ResnetServerRoll.combine``, with main_resnet.py's ``weighting`` default ``avg``: for a weight of more than one
    dim other than the classifier's::

        if self.cfg['weighting'] == 'avg':
            K = 1
        tmp_v[torch.meshgrid(param_idx[m][k])] += K * local_parameters[m][k]
        count[k][torch.meshgrid(param_idx[m][k])] += K
        ...
        tmp_v[count[k] > 0] = tmp_v[count[k] > 0].div_(count[k][count[k] > 0])
        v[count[k] > 0] = tmp_v[count[k] > 0].to(v.dtype)

    and the classifier's rows over the clients holding their label (``param_idx[m][k][0][label_split]``).

Every other parameter (norms, biases, the classifier) is weighted there by ``self.tmp_counts[k][idx]``, the times
the coordinate was updated before plus one; its ``self.tmp_counts = tmp_counts_cpy`` inside the parameter loop makes
the round's own increments visible to the round's later clients from the second parameter on, so in the first round
a coordinate all M clients cover gets weights 1, 2, …, M, tending to equal weights as the counts grow. The rule taken
is the equal weight of the conv path (HeteroFL's ``count += 1``, docs/reproduction/packs.md); that residue is not
reproduced."""

import math
import os

import numpy as np
import torch

from algorithm_runs import small_config
from hasfl_ray.aggregation.label_split import aggregate_label_split
from hasfl_ray.algorithms.fedrolex import FedRolex
from hasfl_ray.models.slicing import DimSlice, ParamSpec

CLASSES = 5
SPECS = {name: ParamSpec(name, dims) for name, dims in {
    "conv1.weight": (DimSlice(8), DimSlice(3, False)), "n1.weight": (DimSlice(8),), "n1.bias": (DimSlice(8),),
    "conv2.weight": (DimSlice(6), DimSlice(8)), "linear.weight": (DimSlice(CLASSES, False), DimSlice(6)),
    "linear.bias": (DimSlice(CLASSES, False),)}.items()}


def source_idx(spec, rate, offset):
    """``split_model``'s kept indices per dim: the window rolled to ``offset`` where the dim is sliced, else all."""
    idx = tuple((offset + torch.arange(math.ceil(rate * d.size))) % d.size if d.scaled else torch.arange(d.size)
                for d in spec.dims)
    return idx if len(idx) > 1 else idx[0]


def source_combine(global_parameters, local_parameters, param_idx, label_split):
    """``combine`` with ``weighting: avg`` (K = 1 a client; the classifier's rows over their label's holders)."""
    out = {}
    for k, v in global_parameters.items():
        v = v.clone()
        count = v.new_zeros(v.size())
        tmp_v = v.new_zeros(v.size())
        for m in range(len(local_parameters)):
            K = 1
            if 'linear' in k:
                idx = list(param_idx[m][k]) if v.dim() > 1 else [param_idx[m][k]]
                idx[0] = idx[0][label_split[m]]
                where = torch.meshgrid(*idx, indexing="ij")
                tmp_v[where] += K * local_parameters[m][k][label_split[m]]
                count[where] += K
            else:
                where = torch.meshgrid(*param_idx[m][k], indexing="ij") if v.dim() > 1 else param_idx[m][k]
                tmp_v[where] += K * local_parameters[m][k]
                count[where] += K
        tmp_v[count > 0] = tmp_v[count > 0].div_(count[count > 0])
        v[count > 0] = tmp_v[count > 0]
        out[k] = v
    return out


def test_fedrolex_with_count_weights_is_the_sources_combine():
    g = torch.Generator().manual_seed(5)
    rates, offset = [1.0, 0.5, 0.25, 0.5], 3  # one round: the same window start for every client and layer
    samples = [120, 37, 64, 250]  # unequal sizes: n_i weights would differ from the source
    holds = np.zeros((4, CLASSES), dtype=bool)
    label_split = [torch.tensor([0, 1]), torch.tensor([2]), torch.tensor([1, 3]), torch.tensor([4, 0])]
    for m, labels in enumerate(label_split):
        holds[m, labels.numpy()] = True
    global_parameters = {k: torch.randn(spec.shape, generator=g, dtype=torch.float64) for k, spec in SPECS.items()}
    updates, local_parameters, param_idx = [], [], []
    for rate in rates:
        idx = {k: source_idx(spec, rate, offset) for k, spec in SPECS.items()}
        update = {k: 0.1 * torch.randn(tuple(len(i) for i in (idx[k] if isinstance(idx[k], tuple) else (idx[k],))),
                                       generator=g, dtype=torch.float64) for k in SPECS}
        local_parameters.append({k: global_parameters[k][torch.meshgrid(*idx[k], indexing="ij")
                                                         if isinstance(idx[k], tuple) else idx[k]] + update[k]
                                 for k in SPECS})
        updates.append({k: t.float().contiguous() for k, t in update.items()})
        param_idx.append(idx)
    source = source_combine(global_parameters, local_parameters, param_idx, label_split)

    def project(weighting):
        algorithm = FedRolex(small_config(algorithm="fedrolex", aggregation_weights=weighting),
                             np.array(rates), np.array(samples))
        weights = algorithm.aggregation_weights([0, 1, 2, 3])
        delta = aggregate_label_split(SPECS, updates, [offset] * 4, weights, holds, ("linear.weight", "linear.bias"),
                                      backend="reference").delta
        return weights, {k: global_parameters[k] + delta[k].double() for k in SPECS}

    weights, counted = project("count")
    assert weights == [1.0] * 4
    for k in SPECS:
        assert torch.allclose(counted[k], source[k], atol=2e-7), k  # float32 updates
    _, by_samples = project("samples")
    assert max(float((by_samples[k] - source[k]).abs().max()) for k in SPECS) > 1e-3  # the departure closed


def test_the_pages_say_which_of_fedrolexs_weights_count_once():
    """docs/algorithms.md and packs.md: K = 1 is FedRolex's rule for its conv weights only; its norms, biases and
    classifier rows carry ``tmp_counts`` (the residue above), and neither page may say the source counts all once."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for page in ("algorithms.md", os.path.join("reproduction", "packs.md")):
        text = " ".join(open(os.path.join(root, "docs", page), encoding="utf-8").read().split())
        assert "tmp_counts" in text, page
        assert "FedRolex's `combine` counts each client once too" not in text, page
