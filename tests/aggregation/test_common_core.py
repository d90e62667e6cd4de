"""The common-core estimator: divergence norms over only the coordinates every participant covers, against a
hand-computed case and a float64 mask oracle on random inputs (leading slices, LSTM gate blocks, windows), and its
wiring through the config, the CLI and the run directory."""

import pytest
import torch

from hasfl_ray.aggregation import aggregate_reference
from hasfl_ray.aggregation.common_core import common_core_divergence
from hasfl_ray.models import build_model, gate_blocks_of
from hasfl_ray.models.slicing import extract_window, window_linear_index


def specs_of(model_name):
    return build_model(model_name).param_specs()


def test_nested_slices_match_a_hand_computed_value():
    specs = specs_of("synthetic")
    name = next(n for n, s in specs.items() if len(s.shape) == 1 and s.shape[0] == 128)  # a hidden layer's bias
    one = {name: specs[name]}
    a = torch.tensor([1.0, 2.0], dtype=torch.float64)              # covers the leading 2 coordinates
    b = torch.tensor([3.0, 0.0, 5.0, 7.0], dtype=torch.float64)    # covers the leading 4
    delta = torch.zeros(128, dtype=torch.float64)
    delta[:4] = torch.tensor([2.0, 1.0, 5.0, 7.0])
    num, den = common_core_divergence(one, [{name: a}, {name: b}], [0, 0], {name: delta})
    # core = the leading 2: a: (1-2)² + (2-1)² = 2; b: (3-2)² + (0-1)² = 2; both: ||Δ̄ on the core||² = 4 + 1 = 5
    assert num.tolist() == [2.0, 2.0] and den.tolist() == [5.0, 5.0]
    masked = aggregate_reference({name: (128,)}, [{name: a}, {name: b}], torch.tensor([1.0, 1.0]), {})
    assert masked.div_den.tolist() == [5.0, 79.0]  # the masked one: b on its own 4 coordinates


def oracle(specs, updates, offsets, delta):
    """Full-size float64 masks: m_i from each client's flat positions, m_core = their product."""
    n = len(updates)
    num, den = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    for name, spec in specs.items():
        full = [torch.zeros(spec.shape, dtype=torch.float64).reshape(-1) for _ in range(n)]
        masks = [torch.zeros_like(f) for f in full]
        for i, (update, offset) in enumerate(zip(updates, offsets)):
            flat = window_linear_index(spec, update[name].shape, offset).reshape(-1)
            full[i][flat] = update[name].reshape(-1).to(torch.float64)
            masks[i][flat] = 1.0
        core = torch.stack(masks).prod(0)
        mean = delta[name].reshape(-1).to(torch.float64)
        for i in range(n):
            num[i] += (core * (full[i] - mean)).square().sum()
            den[i] += (core * mean).square().sum()
    return num, den


@pytest.mark.parametrize("model_name, widths, offsets", [
    ("digits", [0.25, 0.5, 1.0], [0, 0, 0]),
    ("shakespeare", [0.5, 0.75, 0.25], [0, 0, 0]),     # LSTM gate blocks
    ("digits", [0.5, 0.5, 0.25], [0, 3, 5]),           # rolling windows (FedRolex)
])
def test_random_updates_match_the_mask_oracle(model_name, widths, offsets):
    torch.manual_seed(0)
    specs = specs_of(model_name)
    updates = []
    for width, offset in zip(widths, offsets):
        updates.append({name: extract_window(torch.randn(spec.shape), spec, width, offset)
                        for name, spec in specs.items()})
    delta = {name: torch.randn(spec.shape) for name, spec in specs.items()}
    num, den = common_core_divergence(specs, updates, offsets, delta)
    want_num, want_den = oracle(specs, updates, offsets, delta)
    torch.testing.assert_close(num, want_num, rtol=1e-12, atol=0)
    torch.testing.assert_close(den, want_den, rtol=1e-12, atol=0)
    assert gate_blocks_of(specs) or model_name == "digits"


def test_estimator_is_a_config_key_recorded_in_config_yaml(tmp_path):
    import yaml
    from click.testing import CliRunner

    from hasfl_ray.cli.main import main

    args = ["simulate", "--backend", "local", "--rounds", "12", "--clients", "6", "--clients-per-round", "3",
            "--quiet", "--warmup", "10", "--t-adapt", "1"]
    runs = {}
    for estimator in ("masked", "common-core"):
        out = tmp_path / estimator
        result = CliRunner().invoke(main, args + ["--estimator", estimator, "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert yaml.safe_load((out / "config.yaml").read_text())["estimator"] == estimator
        runs[estimator] = (out / "clients.csv").read_text()
    assert runs["masked"] != runs["common-core"]  # H̃ after two adaptation rounds differs
    bad = CliRunner().invoke(main, args + ["--estimator", "both", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "both" in bad.output
