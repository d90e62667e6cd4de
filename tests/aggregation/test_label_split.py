"""Label-split aggregation of the output layer (``classifier_aggregation: label_split``) against HeteroFL's
``Federation.combine`` written out here from its source, not from the project's code:

    diaoenmao/HeteroFL-Computation-and-Communication-Efficient-Federated-Learning-for-Heterogeneous-Clients,
    src/fed.py at commit cc40f3e46b0fab5364d62a1bb623d3764daf179d, ``Federation.combine``, model 'conv':
    the output weight and bias are the last parameters named weight and bias; client m adds
    ``local_parameters[m][k][label_split]`` at ``param_idx[m][k][0][label_split]`` (rows) and counts 1 there; every
    other parameter adds its whole local tensor at ``param_idx[m][k]``; ``v[count > 0] = tmp_v / count``, the global
    value kept where ``count == 0``.

FedRolex (AIoT-MLSys-Lab/FedRolex, resnet_server.py, ``ResnetServerRoll.combine``) has the same label split over its
rolled ``param_idx`` (``(o + arange(kept)) % size`` here); its per-coordinate ``tmp_counts`` weights are not taken.
The weighted cases replace the source's ``count += 1`` by ``count += w_m`` (``heterofl_weighting: samples``)."""

import math

import numpy as np
import pytest
import torch

from hasfl_ray.aggregation.label_split import aggregate_label_split, client_label_masks, output_layer
from hasfl_ray.errors import ConfigError
from hasfl_ray.models.slicing import DimSlice, ParamSpec

SOURCE = "HeteroFL src/fed.py @ cc40f3e46b0fab5364d62a1bb623d3764daf179d, Federation.combine"
CLASSES = 6


def conv_like_specs():
    """A chain as HeteroFL's 'conv' model slices it: the first layer's input whole, hidden outputs ceil(rate * n),
    the output layer every row (one a class) over the previous layer's kept columns."""
    dims = {"layers.0.weight": (DimSlice(10), DimSlice(4, False)), "layers.0.bias": (DimSlice(10),),
            "layers.1.weight": (DimSlice(8), DimSlice(10)), "layers.1.bias": (DimSlice(8),),
            "layers.2.weight": (DimSlice(CLASSES, False), DimSlice(8)), "layers.2.bias": (DimSlice(CLASSES, False),)}
    return {name: ParamSpec(name, d) for name, d in dims.items()}


def source_param_idx(spec, rate, offset):
    """param_idx[m][k] of split_model: per dim the kept indices (HeteroFL: arange(n)[:ceil(rate * n)]; FedRolex: the
    window rolled to start at ``offset``), the unscaled dims (input, classes) whole."""
    def kept(dim):
        if not dim.scaled:
            return torch.arange(dim.size)
        return (offset + torch.arange(math.ceil(rate * dim.size))) % dim.size

    idx = tuple(kept(d) for d in spec.dims)
    return idx if len(idx) > 1 else idx[0]


def heterofl_combine(global_parameters, local_parameters, param_idx, label_split, weights=None):
    """Federation.combine ('conv'), as the source writes it (count += 1; count += w_m with ``weights``)."""
    output_weight_name = [k for k in global_parameters.keys() if 'weight' in k][-1]
    output_bias_name = [k for k in global_parameters.keys() if 'bias' in k][-1]
    out = {}
    for k, v in global_parameters.items():
        v = v.clone()
        parameter_type = k.split('.')[-1]
        count = v.new_zeros(v.size())
        tmp_v = v.new_zeros(v.size())
        for m in range(len(local_parameters)):
            one = 1 if weights is None else weights[m]
            if parameter_type == 'weight':
                if v.dim() > 1:
                    if k == output_weight_name:
                        idx = list(param_idx[m][k])
                        idx[0] = idx[0][label_split[m]]
                        tmp_v[torch.meshgrid(*idx, indexing="ij")] += one * local_parameters[m][k][label_split[m]]
                        count[torch.meshgrid(*idx, indexing="ij")] += one
                    else:
                        tmp_v[torch.meshgrid(*param_idx[m][k], indexing="ij")] += one * local_parameters[m][k]
                        count[torch.meshgrid(*param_idx[m][k], indexing="ij")] += one
                else:
                    tmp_v[param_idx[m][k]] += one * local_parameters[m][k]
                    count[param_idx[m][k]] += one
            else:
                if k == output_bias_name:
                    idx = param_idx[m][k][label_split[m]]
                    tmp_v[idx] += one * local_parameters[m][k][label_split[m]]
                    count[idx] += one
                else:
                    tmp_v[param_idx[m][k]] += one * local_parameters[m][k]
                    count[param_idx[m][k]] += one
        tmp_v[count > 0] = tmp_v[count > 0].div_(count[count > 0])
        v[count > 0] = tmp_v[count > 0].to(v.dtype)
        out[k] = v
    return out


def round_of(seed, rates, label_split, offset):
    """Random float64 global parameters, packed updates at ``rates`` and the source's local parameters."""
    generator = torch.Generator().manual_seed(seed)
    specs = conv_like_specs()
    global_parameters = {name: torch.randn(spec.shape, generator=generator, dtype=torch.float64)
                         for name, spec in specs.items()}
    updates, local, param_idx = [], [], []
    for rate in rates:
        idx = {name: source_param_idx(spec, rate, offset) for name, spec in specs.items()}
        packed = {name: torch.randn(spec.sliced_shape(rate), generator=generator, dtype=torch.float64)
                  for name, spec in specs.items()}
        for name, spec in specs.items():  # the packed order is the source's index order
            assert packed[name].shape == tuple(len(i) for i in (idx[name] if spec.dims[1:] else (idx[name],)))
        updates.append(packed)
        param_idx.append(idx)
        local.append({name: (global_parameters[name][torch.meshgrid(*idx[name], indexing="ij")]
                             if len(specs[name].dims) > 1 else global_parameters[name][idx[name]]) + packed[name]
                      for name in specs})
    holds = np.zeros((len(rates), CLASSES), dtype=bool)
    for m, labels in enumerate(label_split):
        holds[m, labels] = True
    return specs, global_parameters, updates, local, param_idx, holds


# label 5 is held by no client of the round: its rows keep the global value
SPLITS = [[0, 1], [1, 2], [3], [0, 4], [2, 3]]
RATES = [1.0, 0.5, 0.25, 0.75, 0.5]


@pytest.mark.parametrize("offset", [0, 3], ids=["heterofl", "fedrolex-window"])
@pytest.mark.parametrize("weighted", [False, True], ids=["count", "samples"])
@pytest.mark.parametrize("backend", ["reference", "auto"])
def test_the_round_equals_heterofls_combine(offset, weighted, backend):
    specs, global_parameters, updates, local, param_idx, holds = round_of(11 + offset, RATES, SPLITS, offset)
    weights = [3.0, 1.0, 7.0, 2.0, 5.0] if weighted else [1.0] * len(RATES)
    expected = heterofl_combine(global_parameters, local, param_idx, SPLITS, weights if weighted else None)
    output = output_layer(specs, CLASSES)
    assert output == ("layers.2.weight", "layers.2.bias")
    result = aggregate_label_split(specs, updates, [offset] * len(RATES), weights, holds, output, backend=backend)
    assert list(result.delta) == list(specs)
    for name in specs:
        torch.testing.assert_close(global_parameters[name] + result.delta[name], expected[name], rtol=1e-12,
                                   atol=1e-12, msg=f"{name} differs from {SOURCE}")
    # rows of label 5 (no holder) keep the global value: Δ̄ exactly 0
    assert not result.delta["layers.2.weight"][5].any() and result.delta["layers.2.bias"][5] == 0
    # label 3 is held by two clients of rates 0.25 and 0.5: columns past the 0.5 window have no holder
    kept = {(offset + j) % 8 for j in range(4)}
    for j in range(8):
        assert bool(result.delta["layers.2.weight"][3, j] != 0) == (j in kept)


def test_the_divergence_norms_are_eq5_against_the_applied_mean():
    """m_i: client i's own coordinates (every output row it trained); Δ̄: the label-split mean; float64."""
    specs, _, updates, _, param_idx, holds = round_of(5, RATES, SPLITS, 2)
    weights = [2.0, 1.0, 1.0, 4.0, 3.0]
    result = aggregate_label_split(specs, updates, [2] * len(RATES), weights, holds, output_layer(specs, CLASSES),
                                   backend="reference")
    for m, update in enumerate(updates):
        num = den = 0.0
        for name, packed in update.items():
            idx = param_idx[m][name]
            at = result.delta[name][torch.meshgrid(*idx, indexing="ij")] if packed.dim() > 1 else \
                result.delta[name][idx]
            num += float((packed - at).square().sum())
            den += float(at.square().sum())
        assert float(result.div_num[m]) == pytest.approx(num, rel=1e-12)
        assert float(result.div_den[m]) == pytest.approx(den, rel=1e-12)
    total = sum(spec.numel() for spec in specs.values())
    uncovered = 8 + 1  # label 5's row and bias
    uncovered += sum(int(result.delta["layers.2.weight"][k].eq(0).sum()) for k in range(5))
    assert result.covered_fraction == pytest.approx((total - uncovered) / total)
    assert result.covered_by_layer["layers.2.bias"] == pytest.approx(5 / 6)


def test_when_every_client_holds_every_label_the_output_layer_is_the_plain_mean():
    from hasfl_ray.aggregation import aggregate_updates

    specs, _, updates, _, _, _ = round_of(3, RATES, SPLITS, 0)
    holds = np.ones((len(RATES), CLASSES), dtype=bool)
    weights = [1.0, 2.0, 3.0, 4.0, 5.0]
    split = aggregate_label_split(specs, updates, [0] * 5, weights, holds, output_layer(specs, CLASSES), "reference")
    plain = aggregate_updates({n: s.shape for n, s in specs.items()}, updates, weights, backend="reference")
    for name in specs:
        torch.testing.assert_close(split.delta[name], plain.delta[name], rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(split.div_num, plain.div_num, rtol=1e-12, atol=0)
    torch.testing.assert_close(split.div_den, plain.div_den, rtol=1e-12, atol=0)
    assert split.covered_fraction == pytest.approx(plain.covered_fraction)


@pytest.mark.parametrize("model", ["digits", "cifar10", "emnist", "synthetic", "shakespeare", "preresnet18"])
def test_every_built_in_models_output_layer_is_its_last_linear(model):
    from hasfl_ray.models import build_model, register_model
    from hasfl_ray.models.resnet import resnet_config

    if model == "preresnet18":
        model, config = resnet_config("preresnet18", 3, 10, 32)
        register_model(model, config)
    net = build_model(model)
    linear = [m for m in net.modules() if isinstance(m, torch.nn.Linear)][-1]
    names = output_layer(net.param_specs(), linear.out_features)
    params = dict(net.named_parameters())
    assert [params[name] is p for name, p in zip(names, (linear.weight, linear.bias))] == [True, True]


def test_a_model_without_an_output_layer_of_the_classes_is_one_sentence():
    specs = conv_like_specs()
    with pytest.raises(ConfigError, match=r"^classifier_aggregation is 'label_split' but the model's output layer "
                                          r"was not found \(its last weight 'layers.2.weight' has shape \(6, 8\)\)"):
        output_layer(specs, 10)
    wide = {**specs, "layers.2.weight": ParamSpec("layers.2.weight", (DimSlice(CLASSES), DimSlice(8)))}
    with pytest.raises(ConfigError, match="one unscaled row per class"):
        output_layer(wide, CLASSES)
    assert output_layer({k: v for k, v in specs.items() if k != "layers.2.bias"}, CLASSES) == ("layers.2.weight",)


def test_the_label_sets_are_the_partitions_split_else_the_clients_labels():
    from hasfl_ray.data.digits import load_digits_federated

    split = load_digits_federated(10, 0.3, 1, partition="classes:2")
    masks = client_label_masks(split)
    assert [sorted(np.flatnonzero(row).tolist()) for row in masks] == split.label_split
    iid = load_digits_federated(6, 0.3, 1, partition="iid")
    assert iid.label_split is None
    np.testing.assert_array_equal(client_label_masks(iid), iid.label_histograms() > 0)
