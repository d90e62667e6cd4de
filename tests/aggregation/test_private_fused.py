"""The fused aggregation with DP in its pass (hasfl_ray::aggregate_private_into, hasfl_ray/ops/aggregate_private.py)
against a float64 oracle written out in torch: clip, masked mean, holder counts and noise; determinism across threads;
the draws themselves; and agreement with the torch path of hasfl_ray/aggregation/privacy.py without noise."""

from __future__ import annotations

import math

import pytest
import torch

from aggregation_cases import global_indices, oracle, random_federation
from hasfl_ray.aggregation import aggregate_updates, validate_inputs
from hasfl_ray.aggregation.privacy import PrivacySettings, privatize
from hasfl_ray.ops import aggregate_private as private
import importlib.util

#: a DP run accounts epsilon, which needs the privacy extra (dp-accounting; the GPU machine of 2026-11-29 lacked it)
needs_accounting = pytest.mark.skipif(importlib.util.find_spec("dp_accounting") is None,
                                      reason="needs the privacy extra (dp-accounting): a DP run accounts epsilon")

pytestmark = pytest.mark.skipif(not private.available(), reason="needs hasfl_ray._C built with aggregate_private_into")

LAYOUTS = [(True, False), (False, False), (True, True), (False, True)]
LAYOUT_IDS = ["nested", "boxes", "rolling", "rolling-boxes"]


def _norm(update):
    return math.sqrt(sum(float(t.double().square().sum()) for t in update.values()))


def _bounds(updates):
    """Bounds that clip some clients and not others (and one unbounded)."""
    norms = sorted(_norm(u) for u in updates)
    bound = norms[len(norms) // 2] if norms else 1.0
    return [math.inf if i == 0 else bound * (0.5 + 0.25 * (i % 3)) for i in range(len(updates))]


def _oracle(federation, bounds, weights):
    """Clip in float64, then the masked weighted mean of aggregation_cases.oracle, plus k_j from explicit masks."""
    clipped = []
    for update, bound in zip(federation.updates, bounds):
        norm = _norm(update)
        factor = 1.0 if norm <= bound else bound / norm
        clipped.append({name: t.double() * factor for name, t in update.items()})
    mean, div_num, div_den, covered = oracle(federation.shapes, clipped, weights, federation.gate_blocks,
                                             federation.offsets)
    counts = {}
    for name, shape in federation.shapes.items():
        k = torch.zeros(shape, dtype=torch.float64)
        for i, update in enumerate(federation.updates):
            if name in update:
                start = federation.offsets[i].get(name) if federation.offsets is not None else None
                mask = torch.zeros(shape, dtype=torch.float64)
                mask[global_indices(shape, update[name].shape, federation.gate_blocks.get(name, 1), start)] = 1.0
                k += mask
        counts[name] = k
    return mean, div_num, div_den, covered, counts


def _run(federation, bounds, weights, std=0.0, seed=5, offset=0, expected=None):
    shapes, _, blocks = validate_inputs(federation.shapes, federation.updates, weights, federation.gate_blocks)
    return private.aggregate_private(shapes, federation.updates, weights, bounds, std, seed, offset, expected,
                                     blocks, federation.offsets)


def _flat_index(shapes):
    """Each coordinate's index in the flat output (names in order): the key of its draw."""
    out, start = {}, 0
    for name, shape in shapes.items():
        n = math.prod(shape)
        out[name] = torch.arange(start, start + n).reshape(shape)
        start += n
    return out, start


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("nested,rolling", LAYOUTS, ids=LAYOUT_IDS)
def test_without_noise_equals_clip_then_masked_mean_and_counts(dtype, nested, rolling):
    federation = random_federation(seed=7, num_clients=9, dtype=dtype, nested=nested, rolling=rolling)
    bounds = _bounds(federation.updates)
    got = _run(federation, bounds, federation.weights)
    mean, div_num, div_den, covered, counts = _oracle(federation, bounds, federation.weights)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-12
    scale = max(float(m.abs().max()) for m in mean.values() if m.numel())
    for name in federation.shapes:
        assert got.result.delta[name].dtype == dtype
        torch.testing.assert_close(got.result.delta[name].double(), mean[name], rtol=0, atol=tolerance * scale)
        assert torch.equal(got.counts[name], counts[name]), name
    norm_scale = max(float(div_num.max()), float(div_den.max()))
    torch.testing.assert_close(got.result.div_num, div_num, rtol=1e-10, atol=1e-10 * norm_scale)
    torch.testing.assert_close(got.result.div_den, div_den, rtol=1e-10, atol=1e-10 * norm_scale)
    assert got.result.covered_fraction == pytest.approx(covered, abs=1e-15)
    torch.testing.assert_close(got.norms, torch.tensor([_norm(u) for u in federation.updates], dtype=torch.float64),
                               rtol=1e-12, atol=0)


@pytest.mark.parametrize("expected", [None, 6.5], ids=["fixed-size", "poisson"])
@pytest.mark.parametrize("nested,rolling", LAYOUTS, ids=LAYOUT_IDS)
def test_noise_is_the_draws_over_the_holders_or_the_public_denominator(expected, nested, rolling):
    federation = random_federation(seed=11, num_clients=7, dtype=torch.float64, nested=nested, rolling=rolling)
    weights = [1.0] * len(federation.updates)  # DP's count-weighted mean: Δ̄ k is the clipped sum
    bounds = _bounds(federation.updates)
    std, seed, offset = 0.7, 123456789, 4
    got = _run(federation, bounds, weights, std, seed, offset, expected)
    mean, _, _, _, counts = _oracle(federation, bounds, weights)
    flat, total = _flat_index(federation.shapes)
    draws = private.normals(seed, offset, total)
    for name in federation.shapes:
        k, xi = counts[name], draws[flat[name]] * std
        if expected is None:
            want = torch.where(k > 0, mean[name] + xi / torch.where(k > 0, k, 1), 0)
        else:
            want = (mean[name] * k + xi) / expected
        torch.testing.assert_close(got.result.delta[name], want, rtol=1e-12, atol=1e-12)
    uncovered = torch.cat([(counts[n] == 0).flatten() for n in federation.shapes])
    values = torch.cat([got.result.delta[n].flatten() for n in federation.shapes])
    assert uncovered.any()  # the untrained parameter: no noise there unless Poisson
    assert (values[uncovered] == 0).all() == (expected is None)


def test_same_key_is_bit_identical_with_one_and_two_threads_and_another_key_is_not():
    federation = random_federation(seed=3, num_clients=12, dtype=torch.float32, nested=False, rolling=True)
    bounds = _bounds(federation.updates)
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            runs.append(_run(federation, bounds, federation.weights, 0.3, seed=9, offset=2))
    finally:
        torch.set_num_threads(before)
    for other in runs[1:]:
        for name in federation.shapes:
            assert torch.equal(runs[0].result.delta[name], other.result.delta[name]), name
            assert torch.equal(runs[0].counts[name], other.counts[name]), name
        for a, b in ((runs[0].result.div_num, other.result.div_num), (runs[0].result.div_den, other.result.div_den),
                     (runs[0].norms, other.norms)):
            assert torch.equal(a, b)
    moved = _run(federation, bounds, federation.weights, 0.3, seed=9, offset=3)
    assert not torch.equal(moved.result.delta["conv1.weight"], runs[0].result.delta["conv1.weight"])


def test_draws_are_standard_normal_and_keyed_by_seed_offset_and_index():
    n = 200_000
    z = private.normals(2024, 0, n)
    assert z.dtype == torch.float64 and z.shape == (n,) and torch.isfinite(z).all()
    assert abs(float(z.mean())) < 5 / math.sqrt(n)
    assert abs(float(z.std()) - 1) < 5 * math.sqrt(0.5 / n)
    for q, bound in ((0.5, 0.0), (0.8413447460685429, 1.0), (0.9772498680518208, 2.0)):  # Φ(0), Φ(1), Φ(2)
        assert abs(float((z <= bound).double().mean()) - q) < 5 * math.sqrt(q * (1 - q) / n)
    assert torch.equal(private.normals(2024, 0, 1000), z[:1000])  # draw j does not depend on n
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(private.normals(2024, 0, n), z)  # nor on the threads that drew it
    finally:
        torch.set_num_threads(before)
    for other in (private.normals(2025, 0, 1000), private.normals(2024, 1, 1000)):
        assert not torch.equal(other, z[:1000])
        assert abs(float(torch.corrcoef(torch.stack([other, z[:1000]]))[0, 1])) < 0.15


def test_without_noise_equals_the_torch_privatize_path_with_a_repeated_client():
    federation = random_federation(seed=21, num_clients=6, dtype=torch.float64, nested=True, rolling=False)
    shapes, _, blocks = validate_inputs(federation.shapes, federation.updates, [1.0] * 6, federation.gate_blocks)
    clients = [0, 1, 2, 2, 3, 4]  # an asynchronous buffer may hold two updates of one client
    norms = sorted(_norm(u) for u in federation.updates)
    clip = (norms[3] + norms[4]) / 2  # not at a norm: the two paths' norms differ in the last place
    settings = PrivacySettings(noise_multiplier=0.0, clip=clip, seed=0)

    def mean_of(updates, extra):
        return aggregate_updates(shapes, updates, [1.0] * len(updates), blocks, backend="fused")

    aggregate, keys = privatize(mean_of, shapes, federation.updates, clients, settings)
    bounds = [clip / clients.count(c) for c in clients]
    got = _run(federation, bounds, [1.0] * 6)
    for name in shapes:
        torch.testing.assert_close(got.result.delta[name], aggregate.delta[name], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.result.div_num, aggregate.div_num, rtol=1e-9, atol=1e-12)
    assert keys["dp_clipped"] == sum(float(n) > clip for n in got.norms) / 6


def test_bad_arguments_are_refused_in_a_sentence():
    federation = random_federation(seed=1, num_clients=3, dtype=torch.float64)
    with pytest.raises(ValueError, match="bounds has 2 entries but updates has 3 clients"):
        _run(federation, [1.0, 1.0], [1.0] * 3)
    with pytest.raises(RuntimeError, match="noise_std is -1"):
        _run(federation, [1.0] * 3, [1.0] * 3, std=-1.0)
    with pytest.raises(RuntimeError, match="expected positive"):
        _run(federation, [1.0, 0.0, 1.0], [1.0] * 3)


def test_numpy_draws_are_the_kernels_bit_for_bit():
    """The fallback where the extension is missing, and the check that the host build rounds every operation of
    csrc/private_normal.h once (no fused multiply-add): the CUDA kernels' draws are these bits too."""
    from hasfl_ray.aggregation.philox import philox_normals

    for key, offset in ((5, 0), (2 ** 62 + 12345, 7), (0, 2 ** 33 + 1)):
        assert torch.equal(philox_normals(key, offset, 50_000), private.normals(key, offset, 50_000))


def test_the_written_out_log_and_cos_are_within_an_ulp_and_a_half():
    """ln u1 and cos 2πu2 of private_normal.h (in philox.py's numpy form, the same bits) against a 120-bit mpmath,
    and the draws against numpy's own log and cos, on uniforms of the draws' grid including the ends."""
    mpmath = pytest.importorskip("mpmath", reason="needs mpmath (a sympy dependency) for the exact reference")
    import numpy as np

    from hasfl_ray.aggregation.philox import cos_turn, log_unit

    rng = np.random.default_rng(7)
    u1 = (rng.integers(0, 2 ** 53, 4000).astype(np.float64) + 0.5) * 2.0 ** -53
    u1[:3] = [(0 + 0.5) * 2.0 ** -53, 1.0, 0.5]
    u2 = rng.integers(0, 2 ** 53, 4000).astype(np.float64) * 2.0 ** -53
    u2[:5] = [0.0, 0.25, 0.5, 0.75, 1.0 - 2.0 ** -53]
    mpmath.mp.prec = 120
    ln, cos = log_unit(u1), cos_turn(u2)
    for i in range(len(u1)):
        exact_ln = mpmath.log(mpmath.mpf(float(u1[i])))
        exact_cos = mpmath.cospi(2 * mpmath.mpf(float(u2[i])))
        assert abs(float(mpmath.mpf(float(ln[i])) - exact_ln)) <= 1.5 * np.spacing(abs(float(exact_ln))) or ln[i] == 0
        assert abs(float(mpmath.mpf(float(cos[i])) - exact_cos)) <= 1.5 * np.spacing(abs(float(exact_cos)))
    assert ln[1] == 0.0 and cos[0] == 1.0 and cos[2] == -1.0
    numpy_draws = np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2)
    assert np.max(np.abs(np.sqrt(-2.0 * ln) * cos - numpy_draws)) < 1e-14


@pytest.mark.parametrize("expected", [None, 4.5], ids=["fixed-size", "poisson"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_servers_fused_form_adds_what_the_torch_path_adds(dtype, expected):
    """Leading slices on a CPU server take the one-pass op (server_privacy.fused_form); its noised mean equals the
    torch path's (the same draws), and the path is not taken where the device has none or the fallback switch is set
    (rolling windows: test_private_fused_windows.py; index sets and masks: test_private_fused_sparse.py; the label
    split: test_private_fused_label_split.py)."""
    from types import SimpleNamespace

    from hasfl_ray.engine.server_privacy import fused_form

    federation = random_federation(seed=31, num_clients=6, dtype=dtype, nested=True, rolling=False)
    shapes, _, blocks = validate_inputs(federation.shapes, federation.updates, [1.0] * 6, federation.gate_blocks)
    server = SimpleNamespace(shapes=shapes, gate_blocks=blocks, device=torch.device("cpu"), aggregation_backend="auto")
    updates, clients = federation.updates, [0, 1, 2, 3, 4, 4]
    fused = fused_form(server, updates, [0] * 6, None)
    assert fused is not None
    norms = sorted(_norm(u) for u in updates)
    clip = (norms[2] + norms[3]) / 2  # not at a norm: the two paths' norms differ in the last place
    results = []
    for form in (fused, None):
        settings = PrivacySettings(noise_multiplier=0.9, clip=clip, seed=17, updates=3, quantile=0.5,
                                   count_noise=0.1, expected=expected)
        results.append(privatize(lambda ups, extra: aggregate_updates(shapes, ups, [1.0] * len(ups), blocks),
                                 shapes, updates, clients, settings, form) + (settings.clip,))
    (got, got_keys, got_clip), (want, want_keys, want_clip) = results
    tolerance = 2e-6 if dtype == torch.float32 else 1e-12
    for name in shapes:
        torch.testing.assert_close(got.delta[name], want.delta[name], rtol=tolerance, atol=tolerance)
    assert got_keys == pytest.approx(want_keys, rel=1e-12) and got_clip == pytest.approx(want_clip, rel=1e-12)
    for other in (dict(aggregation_backend="reference"), dict(device=torch.device("meta"))):
        assert fused_form(SimpleNamespace(**{**vars(server), **other}), updates, [0] * 6, None) is None


@needs_accounting
def test_a_dp_run_of_leading_slices_goes_through_the_one_pass_op(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from hasfl_ray.cli.main import main

    calls = []
    original = private.aggregate_private

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(private, "aggregate_private", counting)
    result = CliRunner().invoke(main, ["simulate", "--rounds", "2", "--clients", "6", "--clients-per-round", "3",
                                       "--quiet", "--dp-noise-multiplier", "1.1", "--dp-clip", "0.5", "--backend",
                                       "local", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert len(calls) == 2  # one DP update a round
