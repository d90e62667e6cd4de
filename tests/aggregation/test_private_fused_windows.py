"""Rolling windows (FedRolex) through the fused DP op: the server's channel offsets become the layout's element starts
(hasfl_ray.aggregation.windows.element_starts) and the round goes through hasfl_ray::aggregate_private_into
(server_privacy.fused_form). Checked against a float64 oracle written from hasfl_ray.models.slicing's own window
indices (mixed widths, mixed and wrapping offsets, a flattened conv dim's unit, gate blocks) and against the torch path
of the same server (the same draws: equal to rounding, not bit for bit, see test_the_fused_windows_equal_...)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from hasfl_ray.aggregation.privacy import PrivacySettings, noise_key
from hasfl_ray.aggregation.windows import element_starts
from hasfl_ray.engine import server_privacy
from hasfl_ray.engine.server import Server
from hasfl_ray.models.slicing import DimSlice, ParamSpec, gate_blocks_of, window_linear_index
from hasfl_ray.ops import aggregate_private as private
import importlib.util

#: a DP run accounts epsilon, which needs the privacy extra (dp-accounting; the GPU machine of 2026-11-29 lacked it)
needs_accounting = pytest.mark.skipif(importlib.util.find_spec("dp_accounting") is None,
                                      reason="needs the privacy extra (dp-accounting): a DP run accounts epsilon")

pytestmark = pytest.mark.skipif(not private.available(), reason="needs hasfl_ray._C built with aggregate_private_into")

# Every kind of dim a window meets: scaled conv dims beside unscaled kernel positions, a flattened conv output (unit 4),
# LSTM gate blocks (4 blocks of 6 channels), a parameter no dim of which is scaled.
SPECS = {
    "conv.weight": ParamSpec("conv.weight", (DimSlice(8), DimSlice(6), DimSlice(3, scaled=False),
                                             DimSlice(3, scaled=False))),
    "conv.bias": ParamSpec("conv.bias", (DimSlice(8),)),
    "fc.weight": ParamSpec("fc.weight", (DimSlice(10), DimSlice(32, unit=4))),
    "lstm.weight": ParamSpec("lstm.weight", (DimSlice(24, blocks=4), DimSlice(10))),
    "lstm.bias": ParamSpec("lstm.bias", (DimSlice(24, blocks=4),)),
    "scale": ParamSpec("scale", (DimSlice(7, scaled=False),)),
}
WIDTHS = [1.0, 0.25, 0.5, 0.75, 0.5, 0.25, 0.75]
OFFSETS = [3, 7, 13, 5, 29, 0, 119]  # mixed, wrapping round every channel count (6, 8, 10), a full width rolled


def federation(dtype, seed=3, widths=WIDTHS, offsets=OFFSETS):
    generator = torch.Generator().manual_seed(seed)
    updates = [{name: torch.randn(spec.sliced_shape(p), generator=generator, dtype=torch.float64).to(dtype)
                for name, spec in SPECS.items()} for p in widths]
    return updates, list(offsets)


def server(backend="auto"):
    specs = SPECS
    ns = SimpleNamespace(specs=specs, shapes={n: s.shape for n, s in specs.items()}, gate_blocks=gate_blocks_of(specs),
                         device=torch.device("cpu"), aggregation_backend=backend, estimator="unbiased",
                         output_layer=None)
    ns._aggregate = lambda *args: Server._aggregate(ns, *args)  # the server's own routing, on these specs
    return ns


def norm(update):
    return math.sqrt(sum(float(t.double().square().sum()) for t in update.values()))


def oracle(updates, offsets, clients, clip, z, key, offset, expected):
    """Clip in float64 (C / repeats), scatter every client's values at window_linear_index, k_j from the same
    positions, then (S_j + ξ_j) / k_j (0 where k_j = 0) or (S_j + ξ_j) / expected, ξ_j = z C normal(key, offset, j)."""
    total = sum(spec.numel() for spec in SPECS.values())
    draws = private.normals(key, offset, total) * (z * clip)
    out, start = {}, 0
    for name, spec in SPECS.items():
        s = torch.zeros(spec.shape, dtype=torch.float64).view(-1)
        k = torch.zeros_like(s)
        for update, o, c in zip(updates, offsets, clients):
            bound = clip / clients.count(c)
            factor = min(1.0, bound / norm(update))
            flat = window_linear_index(spec, update[name].shape, o).flatten()
            assert flat.unique().numel() == flat.numel()  # a window never repeats a coordinate
            s.index_add_(0, flat, update[name].double().flatten() * factor)
            k.index_add_(0, flat, torch.ones(flat.numel(), dtype=torch.float64))
        xi = draws[start:start + s.numel()]
        start += s.numel()
        if expected is None:
            value = torch.where(k > 0, (s + xi) / torch.where(k > 0, k, 1), 0)
        else:
            value = (s + xi) / expected
        out[name] = value.view(spec.shape)
    return out


def private_mean(srv, updates, offsets, clients, clip, expected, z=0.8, seed=19, done=2):
    srv.privacy = PrivacySettings(noise_multiplier=z, clip=clip, seed=seed, updates=done, expected=expected)
    settings = PrivacySettings(noise_multiplier=z, clip=clip, seed=seed, updates=done)
    return server_privacy.private_mean(srv, updates, offsets, None, clients), noise_key(settings)


def test_element_starts_are_the_windows_of_the_channel_offsets():
    updates, offsets = federation(torch.float64)
    starts = element_starts(SPECS, updates, offsets)
    assert starts[1]["fc.weight"] == (7 % 10, (7 % 8) * 4)  # a flattened dim starts at its channel's first position
    assert starts[4]["lstm.weight"] == (29 % 6, 29 % 10)  # dim 0 per gate block
    assert starts[2]["scale"] == (0,) and starts[2]["conv.weight"] == (13 % 8, 13 % 6, 0, 0)
    blocked = {"w": ParamSpec("w", (DimSlice(4), DimSlice(8, blocks=2)))}  # blocks past dim 0: not a layout's window
    assert element_starts(blocked, [{"w": torch.zeros(4, 4)}], [1]) is None


@pytest.mark.parametrize("expected", [None, 5.5], ids=["fixed-size", "poisson"])
@pytest.mark.parametrize("offsets", [OFFSETS, [11] * len(WIDTHS)], ids=["mixed", "shared-wrapping"])
def test_the_fused_windows_are_the_float64_oracle(expected, offsets):
    updates, _ = federation(torch.float64, seed=5)
    clients = [0, 1, 2, 3, 3, 4, 5]  # one client twice (an asynchronous buffer): its bound is C / 2
    clip = sorted(norm(u) for u in updates)[3] * 0.9
    calls = []
    original = private.aggregate_private

    def counting(*args, **kwargs):
        calls.append(args[-1] if len(args) > 9 else kwargs.get("offsets"))
        return original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(private, "aggregate_private", counting)
        got, key = private_mean(server(), updates, offsets, clients, clip, expected)
    assert len(calls) == 1 and calls[0] is not None  # one pass of the op, with the windows' element starts
    want = oracle(updates, offsets, clients, clip, 0.8, key, 2, expected)
    for name in SPECS:
        torch.testing.assert_close(got.delta[name], want[name], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("expected", [None, 5.5], ids=["fixed-size", "poisson"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_fused_windows_equal_the_torch_path_to_rounding(dtype, expected):
    """The same draws at the same coordinates; the two differ by rounding only: the op clips in float64 without
    rounding the clipped update to the clients' dtype and sums in its entries' order (largest window first), the
    torch path clips in the dtype and scatters in client order. float64: within 1e-12; float32: within 2e-6."""
    updates, offsets = federation(dtype, seed=9)
    clients = list(range(len(updates)))
    clip = sorted(norm(u) for u in updates)[3] * 0.9
    fused, _ = private_mean(server("auto"), updates, offsets, clients, clip, expected)
    torch_path = server("reference")
    assert server_privacy.fused_form(torch_path, updates, offsets, None) is None
    want, _ = private_mean(torch_path, updates, offsets, clients, clip, expected)
    tolerance = 2e-6 if dtype == torch.float32 else 1e-12
    differ = False
    for name in SPECS:
        assert fused.delta[name].dtype == dtype
        torch.testing.assert_close(fused.delta[name], want.delta[name], rtol=tolerance, atol=tolerance)
        differ |= not torch.equal(fused.delta[name], want.delta[name])
    assert differ or dtype == torch.float64  # float32: the clipped update's rounding shows somewhere
    torch.testing.assert_close(fused.div_num, want.div_num, rtol=1e-5 if dtype == torch.float32 else 1e-10, atol=0)


@needs_accounting
def test_a_dp_fedrolex_run_goes_through_the_one_pass_op(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from hasfl_ray.cli.main import main

    calls = []
    original = private.aggregate_private

    def counting(*args, **kwargs):
        calls.append(args[-1] if len(args) > 9 else kwargs.get("offsets"))
        return original(*args, **kwargs)

    monkeypatch.setattr(private, "aggregate_private", counting)
    result = CliRunner().invoke(main, ["simulate", "--rounds", "2", "--clients", "6", "--clients-per-round", "3",
                                       "--quiet", "--algorithm", "fedrolex", "--dp-noise-multiplier", "1.1",
                                       "--dp-clip", "0.5", "--backend", "local", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert len(calls) == 2  # one DP update a round
    assert any(any(any(start) for start in client.values()) for call in calls if call for client in call)
