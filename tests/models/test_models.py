"""Models: the paper's cost table, physically smaller sub-models, nested masks, extract/insert round trips."""

import json
import math

import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.models import MODEL_CONFIGS, build_model, cost_table, extract, insert_, mask, width_channels

WIDTHS = (0.25, 0.5, 0.75, 1.0)


@pytest.mark.parametrize("name, params, macs", [
    ("cifar10", {0.25: 205_018, 0.5: 815_018, 0.75: 1_830_010, 1.0: 3_249_994}, {1.0: 154_866_688}),
    ("emnist", {1.0: 3_275_518}, {1.0: 118_185_984}),
    ("shakespeare", {1.0: 823_895}, {}),
])
def test_cost_table_reproduces_paper_table_2(name, params, macs):
    rows = {row["p"]: row for row in cost_table(name)}
    for p, expected in params.items():
        assert rows[p]["params"] == expected
    for p, expected in macs.items():
        assert rows[p]["macs"] == expected


def test_cost_table_rounded_figures_match_paper():
    # Table 2's rounded MACs (M) and upload (MB) at every width.
    paper = {"cifar10": [(10.0, 0.82), (39.2, 3.26), (87.4, 7.32), (154.9, 13.00)],
             "emnist": [(7.5, 0.85), (29.7, 3.31), (66.6, 7.40), (118.2, 13.10)],
             "shakespeare": [(4.1, 0.24), (16.1, 0.86), (35.9, 1.88), (63.6, 3.30)]}
    for name, expected in paper.items():
        for row, (macs_m, upload) in zip(cost_table(name), expected):
            assert round(row["macs"] / 1e6, 1) == pytest.approx(macs_m, abs=0.051)
            assert round(row["upload_mb"], 2) == pytest.approx(upload, abs=0.006)


def test_cost_cli_json():
    result = CliRunner().invoke(main, ["cost", "--model", "emnist", "--json"])
    assert result.exit_code == 0
    rows = json.loads(result.output)
    assert [r["p"] for r in rows] == list(WIDTHS)
    assert set(rows[0]) == {"p", "params", "macs", "upload_mb"}
    assert rows[-1]["params"] == 3_275_518


def test_cost_cli_rejects_unknown_model():
    result = CliRunner().invoke(main, ["cost", "--model", "imagenet"])
    assert result.exit_code == 2
    assert "imagenet" in result.output


@pytest.mark.parametrize("name", sorted(MODEL_CONFIGS))
@pytest.mark.parametrize("p", WIDTHS + (0.4, 0.63))
def test_submodel_is_physically_smaller_and_matches_specs(name, p):
    specs = build_model(name).param_specs()
    sub = dict(build_model(name, p).named_parameters())
    assert set(sub) == set(specs)
    for param_name, spec in specs.items():
        assert tuple(sub[param_name].shape) == spec.sliced_shape(p)
    assert sum(t.numel() for t in sub.values()) == sum(s.numel(p) for s in specs.values())


@pytest.mark.parametrize("name", ["cifar10", "shakespeare", "digits"])
def test_masks_are_nested(name):
    specs = build_model(name).param_specs()
    for spec in specs.values():
        previous = torch.zeros(spec.shape, dtype=torch.bool)
        for p in (0.1, 0.25, 0.4, 0.5, 0.75, 0.9, 1.0):
            current = mask(spec, p)
            assert bool((previous <= current).all()), f"{spec.name}: mask({p}) does not contain the smaller one"
            assert int(current.sum()) == spec.numel(p)
            previous = current
        assert bool(previous.all())


def test_lstm_gate_slices_take_leading_units_of_each_gate():
    spec = build_model("shakespeare").param_specs()["lstm.weight_hh_l0"]
    m = mask(spec, 0.25)  # 64 of 256 hidden units, inside each of the 4 gates
    rows = m.any(dim=1).nonzero().flatten()
    expected = torch.cat([torch.arange(g * 256, g * 256 + 64) for g in range(4)])
    assert torch.equal(rows, expected)
    assert int(m[0].sum()) == 64


def test_flattened_fc_keeps_whole_channels():
    model = build_model("emnist")
    spec = model.param_specs()["fc1.weight"]
    assert spec.sliced_shape(0.5) == (256, 128 * 16)  # 128 channels x 4x4 positions


def test_extract_then_insert_round_trips():
    torch.manual_seed(0)
    model = build_model("shakespeare")
    for name, spec in model.param_specs().items():
        full = torch.randn(spec.shape)
        for p in (0.25, 0.6, 1.0):
            packed = extract(full, spec, p)
            assert packed.is_contiguous() and tuple(packed.shape) == spec.sliced_shape(p)
            target = torch.zeros(spec.shape)
            insert_(target, packed, spec)
            m = mask(spec, p)
            assert torch.equal(target[m], full[m])
            assert bool((target[~m] == 0).all())


def test_submodel_forward_runs_on_extracted_weights():
    full = build_model("digits")
    sub = build_model("digits", 0.5)
    specs = full.param_specs()
    with torch.no_grad():
        for name, param in sub.named_parameters():
            param.copy_(extract(dict(full.named_parameters())[name], specs[name], 0.5))
    out = sub(torch.randn(4, 1, 8, 8))
    assert out.shape == (4, 10)


@pytest.mark.parametrize("p, channels, expected", [(0.25, 64, 16), (0.75, 64, 48), (0.4, 64, 26), (1.0, 3, 3),
                                                   (0.01, 10, 1)])
def test_width_channels_is_ceil(p, channels, expected):
    assert width_channels(p, channels) == expected


@pytest.mark.parametrize("p", [0.0, -0.5, 1.01])
def test_width_outside_unit_interval_is_refused(p):
    with pytest.raises(ValueError, match="width p must lie in"):
        width_channels(p, 64)


@pytest.mark.parametrize("p", ["0.5", None, True, torch.tensor(0.5), [0.5]])
def test_a_width_that_is_no_number_is_one_sentence(p):
    """`width_channels` (what docs/plugins.md tells a model plug-in to use) compared a string with a float ("'<' not
    supported between instances of 'float' and 'str'"), asked a tensor for `__round__`, and took True as width 1
    (h62)."""
    with pytest.raises(TypeError, match=r"^width p is .*; expected a number in \(0, 1\]$"):
        width_channels(p, 64)


@pytest.mark.parametrize("shape", [(37, 5, 8, 8), (9, 3, 7, 7), (4, 2, 28, 28), (6, 4, 3, 5)])
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_cnn_max_pool_gives_the_same_bits_without_autograd(shape, ceil_mode):
    """MaxPool2d pools in channels-last order under no_grad: every value (ties, signed zeros, NaN, infinities) is
    nn.MaxPool2d's, bit for bit; with autograd it is nn.MaxPool2d itself (values and gradients)."""
    from hasfl_ray.models.cnn import MaxPool2d

    generator = torch.Generator().manual_seed(sum(shape) + ceil_mode)
    x = torch.relu(torch.randn(*shape, generator=generator))  # many exact zeros: ties in most windows
    flat = x.view(-1)
    picks = torch.randint(flat.numel(), (4,), generator=generator)
    flat[picks[0]], flat[picks[1]], flat[picks[2]], flat[picks[3]] = -0.0, math.nan, math.inf, -math.inf
    fast, plain = MaxPool2d(2, ceil_mode=ceil_mode), torch.nn.MaxPool2d(2, ceil_mode=ceil_mode)
    with torch.no_grad():
        got, want = fast(x), plain(x)
    assert got.shape == want.shape and got.is_contiguous()
    assert torch.equal(got.view(-1).view(torch.int32), want.view(-1).view(torch.int32))
    leaf = x.clone().requires_grad_()
    fast(leaf).nan_to_num().sum().backward()
    grad, leaf.grad = leaf.grad, None
    plain(leaf).nan_to_num().sum().backward()
    assert torch.equal(grad, leaf.grad)
