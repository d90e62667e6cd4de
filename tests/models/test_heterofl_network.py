"""HeteroFL's published network (``--model preresnet18-1112``) and its FLOP counter, checked against the sources'
own rules, re-implemented here from the source files, not from hasfl_ray's functions (issue 35 item 5).

Sources, in diaoenmao/HeteroFL-Computation-and-Communication-Efficient-Federated-Learning-for-Heterogeneous-Clients:

* ``src/models/resnet.py`` at 131f5c0 (2021-02-18; the same ``resnet18`` since 76e892a, 2020-08-28; d026a91,
  2021-03-18, went to [2, 2, 2, 2]): ``ResNet(data_shape, hidden_size, Block, [1, 1, 1, 2], ...)`` with
  ``hidden_size = [int(np.ceil(model_rate * x)) for x in [64, 128, 256, 512]]`` (``src/utils.py``), ``Block``'s
  ``n1, conv1, n2, conv2, shortcut`` and ``forward``, ``ResNet.forward``; the Scaler of ``src/modules/modules.py``.
* ``src/summary.py`` at 96d3f87 (2020-10-01, its last change; the same at HEAD cc40f3e): ``summarize`` (hooks, one
  sample, training mode, a module's FLOPs added once per ``weight``/``bias`` parameter) and ``compute_flops``.
* The counts: ../shared/anchors/sub-model-sources.md, "Exact counts of the (1,1,1,2) network with HeteroFL's
  counter" (and the [2, 2, 2, 2] network's); the authors' table: ``doc/ICLR/HeteroFL Presentation.pptm``, slide 9.
"""

import json
import math
import re

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn
from torch.nn import functional as F

from hasfl_ray.cli.main import main
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import resnet_cost_table
from hasfl_ray.models.resnet import RESNETS, resnet_config

LEVELS = {"a": 1.0, "b": 0.5, "c": 0.25, "d": 0.125, "e": 0.0625}  # src/utils.py: model_split_rate
#: (params, FLOPs) at each level (sub-model-sources.md, "Exact counts ... with HeteroFL's counter").
COUNTS = {
    "preresnet18-1112": {"a": (9_622_090, 330_246_144), "b": (2_408_746, 83_334_144), "c": (603_802, 21_219_840),
                         "d": (151_762, 5_498_112), "e": (38_350, 1_471_104)},
    "preresnet18": {"a": (11_172_170, 557_656_064), "b": (2_796_714, 140_416_000), "c": (701_018, 35_604_992),
                    "d": (176_178, 9_151_744), "e": (44_510, 2_413_184)},
}
#: The authors' table (slide 9, CIFAR-10, PreResNet (1,1,1,2)): row -> (params, FLOPs) as printed.
PUBLISHED = {"a": ("9.6 M", "330.2 M"), "a-e": ("4.8 M", "165.9 M"), "a-b-c-d-e": ("2.6 M", "88.4 M"),
             "b": ("2.4 M", "83.3 M"), "b-e": ("1.2 M", "42.4 M"), "b-c-d-e": ("801 K", "27.9 M"),
             "c": ("604 K", "21.2 M"), "c-e": ("321 K", "11.3 M"), "c-d-e": ("265 K", "9.4 M"),
             "d": ("152 K", "5.5 M"), "d-e": ("95 K", "3.5 M"), "e": ("38 K", "1.5 M")}


# -- HeteroFL's src/summary.py at 96d3f87, re-implemented ----------------------------------------------------------

def compute_flops(module, inp, out):
    """``compute_flops`` and its ``compute_*_flops`` (the branches a network of Conv2d, BatchNorm2d and Linear
    reaches, and the others' rules); anything else prints "not supported" there and counts 0."""
    if isinstance(module, nn.Conv2d):  # compute_Conv2d_flops
        k_h, k_w = module.kernel_size
        out_c, out_h, out_w = out.size()[1:]
        active = inp.size()[0] * out_h * out_w
        flops = k_h * k_w * inp.size()[1] * (out_c // module.groups) * active
        return flops + (out_c * active if module.bias is not None else 0)
    if isinstance(module, (nn.BatchNorm2d, nn.InstanceNorm2d, nn.LayerNorm)):  # compute_Norm_flops
        flops = int(np.prod(inp.shape))
        affine = module.elementwise_affine if isinstance(module, nn.LayerNorm) else module.affine
        return 2 * flops if affine else flops
    if isinstance(module, (nn.AvgPool2d, nn.MaxPool2d, nn.ReLU, nn.ReLU6, nn.PReLU, nn.ELU, nn.LeakyReLU, nn.GELU)):
        return int(np.prod(inp.shape))
    if isinstance(module, nn.Linear):  # compute_Linear_flops
        return int(np.prod(inp.size()[:-1])) * inp.size()[-1] * out.size()[-1]
    return 0


def summarize(model: nn.Module, x: torch.Tensor):
    """``summarize``: (total_num_params, total_num_flops) of one forward pass of ``x`` (batch 1: ``main`` sets
    ``cfg['batch_size'] = {'train': 1, ...}``), the model in training mode, a forward hook on every module but
    Sequential, ModuleList, ModuleDict and the model itself. A module's entry is made on its first call (its FLOPs
    then); it holds its own parameters named weight / bias (``named_parameters()`` of a Block yields ``n1.weight``
    and so on, which it skips), each a mask counted per element; its FLOPs are added once per such parameter."""
    entries, hooks = {}, []

    def hook(module, inputs, output):
        inp = inputs[0] if isinstance(inputs, tuple) else inputs  # make_flops / make_size unwrap tuples
        out = output[0] if isinstance(output, tuple) else output
        entry = entries.setdefault(id(module), {"flops": compute_flops(module, inp, out), "params": {}})
        for name, param in module.named_parameters():
            if param.requires_grad and name in ("weight", "in_proj_weight", "out_proj.weight", "bias",
                                                "in_proj_bias", "out_proj.bias"):
                entry["params"].setdefault(name, torch.zeros(param.size(), dtype=torch.long))
        for mask in entry["params"].values():
            mask += 1

    for module in model.modules():
        if not isinstance(module, (nn.Sequential, nn.ModuleList, nn.ModuleDict)) and module is not model:
            hooks.append(module.register_forward_hook(hook))
    model.train(True)
    with torch.no_grad():
        model(x)
    for handle in hooks:
        handle.remove()
    params = sum(int((mask > 0).sum()) for entry in entries.values() for mask in entry["params"].values())
    flops = sum(entry["flops"] for entry in entries.values() for _ in entry["params"])
    return params, flops


# -- HeteroFL's src/models/resnet.py at 131f5c0, re-implemented ----------------------------------------------------

def heterofl_shapes(rate: float, blocks=(1, 1, 1, 2), classes: int = 10, channels: int = 3):
    """Every parameter's name and shape of ``resnet18(model_rate=rate)`` with cfg['norm'] bn: ``ResNet.__init__``
    and ``_make_layer`` (strides [stride] + [1] * (n - 1), stride 1 in layer1 and 2 after), ``Block.__init__``
    (a 1x1 shortcut where stride != 1 or in_planes != planes)."""
    hidden = [int(np.ceil(rate * x)) for x in [64, 128, 256, 512]]
    shapes, in_planes = {"conv1.weight": (hidden[0], channels, 3, 3)}, hidden[0]
    for i, (planes, count) in enumerate(zip(hidden, blocks)):
        for j, stride in enumerate([1 if i == 0 else 2] + [1] * (count - 1)):
            p = f"layer{i + 1}.{j}"
            shapes.update({f"{p}.n1.weight": (in_planes,), f"{p}.n1.bias": (in_planes,),
                           f"{p}.conv1.weight": (planes, in_planes, 3, 3), f"{p}.n2.weight": (planes,),
                           f"{p}.n2.bias": (planes,), f"{p}.conv2.weight": (planes, planes, 3, 3)})
            if stride != 1 or in_planes != planes:
                shapes[f"{p}.shortcut.weight"] = (planes, in_planes, 1, 1)
            in_planes = planes
    shapes.update({"n4.weight": (hidden[3],), "n4.bias": (hidden[3],), "linear.weight": (classes, hidden[3]),
                   "linear.bias": (classes,)})
    return shapes


def heterofl_forward(params, x, scaler_rate: float, blocks=(1, 1, 1, 2)):
    """``ResNet.forward`` and ``Block.forward`` in training mode with static BatchNorm (track False: batch
    statistics) and the Scaler (``x / rate`` in training, rate = model_rate / global_model_rate)."""
    def norm(name, t):
        return F.batch_norm(t, None, None, params[f"{name}.weight"], params[f"{name}.bias"], training=True)

    out = F.conv2d(x, params["conv1.weight"], padding=1)
    for i, count in enumerate(blocks):
        for j in range(count):
            p, stride = f"layer{i + 1}.{j}", (2 if i > 0 and j == 0 else 1)
            block_in = out
            out = F.relu(norm(f"{p}.n1", block_in / scaler_rate))
            shortcut = F.conv2d(out, params[f"{p}.shortcut.weight"], stride=stride) \
                if f"{p}.shortcut.weight" in params else block_in
            out = F.conv2d(out, params[f"{p}.conv1.weight"], stride=stride, padding=1)
            out = F.conv2d(F.relu(norm(f"{p}.n2", out / scaler_rate)), params[f"{p}.conv2.weight"], padding=1)
            out = out + shortcut
    out = F.relu(norm("n4", out / scaler_rate))
    out = F.adaptive_avg_pool2d(out, 1).view(out.size(0), -1)
    return F.linear(out, params["linear.weight"], params["linear.bias"])


def cost_rows(model: str):
    result = CliRunner().invoke(main, ["cost", "--model", model, "--json"])
    assert result.exit_code == 0, result.output
    return {row["p"]: row for row in json.loads(result.output)}


def shown(value: float) -> str:
    """A count as the authors' table prints it: K below a million (no decimals), else M with one."""
    return f"{value / 1e6:.1f} M" if value >= 1e6 else f"{round(value / 1e3)} K"


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_the_network_is_heterofls_resnet18_of_the_published_table(level):
    p = LEVELS[level]
    model = RESNETS["preresnet18-1112"](width=p)
    assert {n: tuple(t.shape) for n, t in model.named_parameters()} == heterofl_shapes(p)
    assert {n: tuple(t.shape) for n, t in RESNETS["preresnet18"](width=p).named_parameters()} == \
        heterofl_shapes(p, blocks=(2, 2, 2, 2))  # the [2, 2, 2, 2] network of d026a91 on


@pytest.mark.parametrize("p", [1.0, 0.5])
def test_the_forward_pass_is_heterofls(p):
    torch.manual_seed(0)
    model = RESNETS["preresnet18-1112"](width=p).train()  # sBN, the Scaler at model_rate / global_model_rate = p
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        ours, theirs = model(x), heterofl_forward(dict(model.named_parameters()), x, p)
    assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", sorted(COUNTS))
def test_heterofls_counter_gives_the_shared_counts_and_hasfl_ray_cost_reports_them(arch):
    rows = cost_rows(arch)
    assert list(rows) == list(LEVELS.values())  # the cost table's default widths: levels a-e
    for level, p in LEVELS.items():
        counted = summarize(RESNETS[arch](width=p), torch.randn(1, 3, 32, 32))
        assert counted == COUNTS[arch][level], (arch, level)
        assert (rows[p]["params"], rows[p]["flops"]) == counted, (arch, level)


def test_the_authors_table_rows_are_the_mean_over_their_levels():
    """All twelve rows: a row's figures are its levels' counts averaged (dynamic, equal proportions), printed as
    the table prints them; its ratio is that mean over its first level's."""
    rows = cost_rows("preresnet18-1112")
    for row, (params, flops) in PUBLISHED.items():
        levels = [LEVELS[letter] for letter in row.split("-")]
        mean_params = sum(rows[p]["params"] for p in levels) / len(levels)
        mean_flops = sum(rows[p]["flops"] for p in levels) / len(levels)
        assert (shown(mean_params), shown(mean_flops)) == (params, flops), row


def test_cost_prints_the_published_network():
    result = CliRunner().invoke(main, ["cost", "--model", "preresnet18-1112"])
    assert result.exit_code == 0, result.output
    header, a, *_ = result.output.splitlines()
    assert header.split() == ["p", "params", "MACs/sample", "FLOPs/sample", "upload", "MB"]
    assert a.split() == ["1", "9,622,090", "328,930,304", "330,246,144", "38.49"]
    assert resnet_cost_table("preresnet18-1112", widths=(1.0,))[0]["macs"] == 328_930_304


def test_the_model_choice_and_its_bad_values():
    assert RunConfig(model="preresnet18-1112", model_norm="gn").model == "preresnet18-1112"
    with pytest.raises(ConfigError, match=r"model is 'preresnet18-1111'; expected one of preresnet18, resnet18, "
                                          r"preresnet18-1112, or a plug-in model"):
        RunConfig(model="preresnet18-1111")
    bad = CliRunner().invoke(main, ["cost", "--model", "preresnet18-1111"])
    assert bad.exit_code == 2 and "preresnet18-1112" in bad.output and len(bad.output.strip().splitlines()) == 1
    name, config = resnet_config("preresnet18-1112", 3, 10, 32)
    assert name == "preresnet18-1112[3x32x32,10 classes,sbn,scaler on]" and config["kind"] == "preresnet18-1112"


def test_the_published_network_trains_through_the_engine():
    engine = Engine(RunConfig.from_dict({"backend": "local", "clients": 4, "clients_per_round": 2, "rounds": 1,
                                         "local_epochs": 1, "eval_samples": 32, "seed": 3, "algorithm": "heterofl",
                                         "model": "preresnet18-1112", "widths": [0.0625, 0.03125],
                                         "eval_widths": [0.0625, 1.0]}))
    engine.run()
    assert engine.model_name == "preresnet18-1112[1x8x8,10 classes,sbn,scaler on]"
    names = set(engine.initial_params)
    assert {"layer1.0.conv1.weight", "layer4.1.conv2.weight"} <= names and "layer1.1.conv1.weight" not in names
    moved = [n for n, t in engine.backend.get_params().items() if not torch.equal(t, engine.initial_params[n])]
    assert moved and all(math.isfinite(row["test_loss"]) for row in engine.history)


# -- a global model of the row's first level (src/utils.py::process_control, src/fed.py::split_model) ---------------

def heterofl_client_slice(global_shapes, rate: float, global_rate: float):
    """``Federation.split_model`` for 'resnet' at HEAD cc40f3e, re-implemented on shapes: every conv's output
    channels cut to ``int(np.ceil(output_size * scaler_rate))`` (scaler_rate = model_rate / global_model_rate),
    its input channels those of the layer before (the shortcut: the block's input; the norms: the channels they
    follow), the linear layer's input the last conv's output, its rows all kept."""
    scaler_rate = rate / global_rate
    kept = {}
    for name, shape in global_shapes.items():
        if len(shape) == 4:
            kept[name] = (int(np.ceil(shape[0] * scaler_rate)), shape[1] if name == "conv1.weight" else
                          int(np.ceil(shape[1] * scaler_rate)), *shape[2:])
        elif name.startswith("linear.weight"):
            kept[name] = (shape[0], int(np.ceil(shape[1] * scaler_rate)))
        elif name == "linear.bias":
            kept[name] = shape
        else:
            kept[name] = (int(np.ceil(shape[0] * scaler_rate)),)
    return kept


def global_model(global_rate: float):
    name, config = resnet_config("preresnet18-1112", 3, 10, 32, global_width=global_rate)
    return name, config


@pytest.mark.parametrize("row", ["b-e", "b-c-d-e", "c-d-e", "d-e", "e"])
def test_a_rows_global_model_is_its_first_level_and_clients_train_heterofls_slices(row):
    """Row b-e trains the width-1/2 network (``global_model_rate``, its first letter) and a client of rate r the
    r/g slice of it; the parameters and FLOPs of the global model are the authors' counts of that level."""
    from hasfl_ray.models import build_model_from

    letters = row.split("-")
    g = LEVELS[letters[0]]
    name, config = global_model(g)
    full = build_model_from(config)
    assert {n: tuple(t.shape) for n, t in full.named_parameters()} == heterofl_shapes(g)
    assert summarize(full, torch.randn(1, 3, 32, 32)) == COUNTS["preresnet18-1112"][letters[0]]
    specs = full.param_specs()
    for letter in letters:
        r = LEVELS[letter]
        theirs = heterofl_client_slice(heterofl_shapes(g), r, g)
        assert {n: tuple(spec.sliced_shape(r / g)) for n, spec in specs.items()} == theirs, (row, letter)
        assert theirs == heterofl_shapes(r)  # the split is the client's own resnet18(model_rate=r)


@pytest.mark.parametrize("g, r", [(0.5, 0.0625), (0.25, 0.125)])
def test_a_client_of_a_narrow_global_model_scales_by_rate_over_global_rate(g, r):
    """The client's network (``resnet18(model_rate=r)`` with ``scaler_rate = model_rate / global_model_rate``)
    computes what the client's slice of the narrow global model computes here at relative width r / g."""
    from hasfl_ray.models import build_model_from
    from hasfl_ray.models.slicing import extract

    torch.manual_seed(1)
    _, config = global_model(g)
    full = build_model_from(config)
    specs = full.param_specs()
    client = build_model_from(config, r / g).train()
    with torch.no_grad():
        for n, t in client.named_parameters():
            t.copy_(extract(dict(full.named_parameters())[n], specs[n], r / g))
        x = torch.randn(4, 3, 32, 32)
        ours = client(x)
        theirs = heterofl_forward(dict(client.named_parameters()), x, r / g)
    assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_global_width_first_reads_the_first_level_and_refuses_what_does_not_fit():
    base = dict(dataset="cifar10", model="preresnet18-1112", width_mix="b1-e1")
    config = RunConfig(**base, global_width="first")
    assert config.global_width == 0.5
    from hasfl_ray.federation import ladder_of

    assert ladder_of(config).widths == (1.0, 0.125)
    assert ladder_of(RunConfig(**base)).widths == (0.5, 0.0625)  # default: the width-1 global model
    for bad, said in [(dict(global_width=0.25), "wider width 0.5"),
                      (dict(global_width="first", width_mix=[1, 1]), "HeteroFL's notation"),
                      (dict(global_width=0), "expected a width in (0, 1]"),
                      (dict(global_width="half"), "expected a width in (0, 1]"),
                      (dict(global_width=0.5, model=None, widths=[0.5, 0.25], width_mix=None), "model is unset")]:
        with pytest.raises(ConfigError, match=re.escape(said)):
            RunConfig(**{**base, **bad})
    result = CliRunner().invoke(main, ["simulate", "--dataset", "digits", "--global-width", "x"])
    assert result.exit_code == 2 and "--global-width is 'x'" in result.output
