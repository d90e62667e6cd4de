"""The fused aggregation kernel (hasfl_ray._C) against the float64 oracle, on every available device."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregation_cases import Federation, oracle, random_federation, stdout_in_each_build
from hasfl_ray.aggregation import aggregate_updates, validate_inputs
from hasfl_ray.models import build_model, gate_blocks_of
from hasfl_ray.ops import aggregate as ops
from test_reference import assert_matches_oracle

pytestmark = pytest.mark.skipif(not ops.available(), reason="needs hasfl_ray._C built")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not (torch.cuda.is_available() and ops.cuda_available()), reason="needs CUDA"))]


def run_fused(federation: Federation, device: str = "cpu"):
    """Validate like aggregate_updates, then run the kernel into an output poisoned with NaN."""
    updates = [{name: t.to(device) for name, t in update.items()} for update in federation.updates]
    shapes, weights, blocks = validate_inputs(federation.shapes, updates, federation.weights, federation.gate_blocks)
    total = sum(math.prod(shape) for shape in shapes.values())
    dtype = next(t for u in updates for t in u.values()).dtype
    out = torch.full((total,), float("nan"), dtype=dtype, device=device)
    result = ops.aggregate_fused(shapes, updates, weights, blocks, offsets=federation.offsets, out=out)
    for delta in result.delta.values():
        assert delta.numel() == 0 or delta.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
    return result


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("num_clients", [1, 2, 7, 64])
@pytest.mark.parametrize("nested,rolling", [(True, False), (False, False), (True, True), (False, True)],
                         ids=["nested", "boxes", "rolling", "rolling-boxes"])
def test_fused_matches_oracle(device, dtype, num_clients, nested, rolling):
    federation = random_federation(seed=100 + num_clients, num_clients=num_clients, dtype=dtype, nested=nested,
                                   rolling=rolling)
    assert_matches_oracle(run_fused(federation, device), federation, dtype)


def test_backend_fused_and_auto_match_reference():
    federation = random_federation(seed=5, num_clients=9, dtype=torch.float64)
    args = (federation.shapes, federation.updates, federation.weights, federation.gate_blocks)
    reference = aggregate_updates(*args, backend="reference")
    for backend in ("fused", "auto"):
        result = aggregate_updates(*args, backend=backend)
        for name in federation.shapes:
            torch.testing.assert_close(result.delta[name], reference.delta[name], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(result.div_num, reference.div_num, rtol=1e-12, atol=0)
        torch.testing.assert_close(result.div_den, reference.div_den, rtol=1e-12, atol=0)
        assert result.covered_fraction == reference.covered_fraction


@pytest.mark.parametrize("model,num_clients", [("digits", 12), ("shakespeare", 3)])
def test_paper_models_match_reference(model, num_clients):
    specs = build_model(model).param_specs()
    rng = np.random.default_rng(0)
    tiers = rng.choice([0.25, 0.5, 0.75, 1.0], size=num_clients, p=[0.4, 0.25, 0.2, 0.15])
    generator = torch.Generator().manual_seed(0)
    updates = [{name: torch.randn(spec.sliced_shape(p), generator=generator) for name, spec in specs.items()}
               for p in tiers]
    shapes = {name: spec.shape for name, spec in specs.items()}
    weights = rng.integers(10, 500, num_clients).tolist()
    args = (shapes, updates, weights, gate_blocks_of(specs))
    fused, reference = aggregate_updates(*args, backend="fused"), aggregate_updates(*args, backend="reference")
    for name in shapes:
        torch.testing.assert_close(fused.delta[name], reference.delta[name], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(fused.div_num, reference.div_num, rtol=1e-10, atol=0)
    torch.testing.assert_close(fused.div_den, reference.div_den, rtol=1e-10, atol=0)
    assert fused.covered_fraction == reference.covered_fraction


def test_deterministic_across_calls_and_thread_counts():
    federation = random_federation(seed=11, num_clients=40, dtype=torch.float32, nested=True)
    runs = []
    for threads in (1, 2, 1):
        torch.set_num_threads(threads)
        runs.append(run_fused(federation))
    for other in runs[1:]:
        for name in federation.shapes:
            assert torch.equal(other.delta[name], runs[0].delta[name])
        assert torch.equal(other.div_num, runs[0].div_num) and torch.equal(other.div_den, runs[0].div_den)


def test_layout_is_canonical_and_sorted():
    shapes = {"conv": (8, 3, 3, 3), "gates": (16, 5), "bias": (8,), "scalar": ()}
    updates = [
        {"conv": torch.zeros(2, 3, 3, 3), "gates": torch.zeros(8, 5), "bias": torch.zeros(2), "scalar": torch.zeros(())},
        {"conv": torch.zeros(8, 3, 3, 3), "gates": torch.zeros(16, 5), "bias": torch.zeros(5)},
        {"conv": torch.zeros(4, 3, 3, 3), "bias": torch.zeros(4)},
    ]
    layout = ops.build_layout(shapes, updates, {"gates": 4})
    params = layout.params.numpy()
    # conv: trailing (3, 3, 3) held in full by everyone -> a prefix of (216,); gates: (4 blocks, 4 rows, 5) -> (4, 20)
    assert params[0, 0] == 1 and params[0, 1] == 216
    assert params[1, 0] == 2 and tuple(params[1, 1:3]) == (4, 20)
    assert params[2, 0] == 1 and params[3, 0] == 1
    assert list(params[:, ops._PARAM_OUT_OFFSET]) == [0, 216, 296, 304]
    assert layout.total_numel == 305
    entries = layout.entries.numpy()
    conv = entries[params[0, ops._PARAM_ENTRY_BEGIN]:params[0, ops._PARAM_ENTRY_END]]
    assert list(conv[:, ops._ENTRY_CLIENT]) == [1, 2, 0]  # widest first
    assert list(conv[:, ops._ENTRY_PACKED]) == [216, 108, 54]
    gates = entries[params[1, ops._PARAM_ENTRY_BEGIN]:params[1, ops._PARAM_ENTRY_END]]
    assert [tuple(r[ops._ENTRY_PACKED:ops._ENTRY_PACKED + 2]) for r in gates] == [(4, 20), (4, 10)]
    assert all(params[:, ops._PARAM_NESTED])
    assert [tuple(t.shape) for t in layout.packed[:3]] == [(8, 3, 3, 3), (4, 3, 3, 3), (2, 3, 3, 3)]


def test_boxes_that_do_not_nest_are_flagged():
    layout = ops.build_layout({"w": (4, 4)}, [{"w": torch.zeros(4, 1)}, {"w": torch.zeros(1, 4)}], {})
    assert not layout.params[0, ops._PARAM_NESTED]
    rolled = ops.build_layout({"w": (4, 4)}, [{"w": torch.zeros(2, 2)}, {"w": torch.zeros(2, 2)}], {},
                              offsets=[{"w": (1, 0)}, {"w": (0, 0)}])
    assert not rolled.params[0, ops._PARAM_NESTED]


def test_rolling_window_wraps_around():
    # a window of 3 starting at 3 in a dim of 4 holds global indices 3, 0, 1
    update = torch.tensor([[1.0, 2.0, 3.0]])
    federation = Federation({"w": (1, 4)}, [{"w": update}], [2.0], {}, [{"w": (0, 3)}])
    result = run_fused(federation)
    torch.testing.assert_close(result.delta["w"], torch.tensor([[2.0, 3.0, 0.0, 1.0]]))
    assert result.covered_fraction == 0.75


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_against_oracle(data):
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64]), label="dtype")
    num_params = data.draw(st.integers(1, 4), label="num_params")
    num_clients = data.draw(st.integers(1, 6), label="num_clients")
    rolling = data.draw(st.booleans(), label="rolling")
    shapes, blocks = {}, {}
    for p in range(num_params):
        shape = list(data.draw(st.lists(st.integers(1, 5), min_size=0, max_size=4), label=f"shape{p}"))
        if shape and data.draw(st.booleans(), label=f"gated{p}"):
            blocks[f"p{p}"] = data.draw(st.integers(2, 4), label=f"blocks{p}")
            shape[0] *= blocks[f"p{p}"]
        shapes[f"p{p}"] = tuple(shape)
    nested = data.draw(st.booleans(), label="nested")
    widths = sorted((data.draw(st.floats(0.01, 1.0), label=f"width{i}") for i in range(num_clients)), reverse=True)
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16), label="seed"))
    updates, offsets = [], []
    for client in range(num_clients):
        update, starts = {}, {}
        for name, shape in shapes.items():
            g = blocks.get(name, 1)
            if client and data.draw(st.booleans(), label="lacks"):
                continue
            inner = [s // (g if d == 0 else 1) for d, s in enumerate(shape)]
            if nested:
                packed = [max(1, math.ceil(widths[client] * s)) for s in inner]
            else:
                packed = [data.draw(st.integers(0, s), label="packed") for s in inner]
            if packed:
                packed[0] *= g
            update[name] = torch.randn(packed, generator=generator, dtype=torch.float64).to(dtype)
            if rolling:
                starts[name] = tuple(data.draw(st.integers(0, s - 1), label="offset") for s in inner)
        updates.append(update)
        offsets.append(starts)
    weights = [data.draw(st.floats(1e-3, 1e3), label=f"weight{i}") for i in range(num_clients)]
    federation = Federation(shapes, updates, weights, blocks, offsets if rolling else None)
    assert_matches_oracle(run_fused(federation), federation, dtype)


def test_fake_kernel_gives_output_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    federation = random_federation(seed=2, num_clients=3)
    shapes, weights, blocks = validate_inputs(federation.shapes, federation.updates, federation.weights,
                                              federation.gate_blocks)
    layout = ops.build_layout(shapes, federation.updates, blocks)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        out = mode.from_tensor(torch.empty(layout.total_numel))
        packed = [mode.from_tensor(t) for t in layout.packed]
        div_num, div_den, covered = torch.ops.hasfl_ray.aggregate_into(out, packed, layout.params, layout.entries,
                                                                       weights)
    assert div_num.shape == (3,) and div_den.dtype == torch.float64 and covered.shape == ()


def test_op_rechecks_its_arguments_instead_of_crashing():
    federation = random_federation(seed=3, num_clients=2)
    shapes, weights, blocks = validate_inputs(federation.shapes, federation.updates, federation.weights,
                                              federation.gate_blocks)
    layout = ops.build_layout(shapes, federation.updates, blocks)
    out = torch.empty(layout.total_numel)
    op = torch.ops.hasfl_ray.aggregate_into
    with pytest.raises(RuntimeError, match="packed has"):
        op(out, layout.packed[:-1], layout.params, layout.entries, weights)
    with pytest.raises(RuntimeError, match="elements but its entry says"):
        op(out, [t.flatten()[:-1] if t.numel() else t for t in layout.packed], layout.params, layout.entries, weights)
    with pytest.raises(RuntimeError, match="out has"):
        op(torch.empty(3), layout.packed, layout.params, layout.entries, weights)
    grown = layout.entries.clone()
    grown[0, ops._ENTRY_PACKED] += 1000
    with pytest.raises(RuntimeError, match="packed size"):
        op(out, layout.packed, layout.params, grown, weights)
    with pytest.raises(RuntimeError, match="weights"):
        op(out, layout.packed, layout.params, layout.entries, weights[:1])
    with pytest.raises(RuntimeError, match="dtype"):
        op(out.double(), layout.packed, layout.params, layout.entries, weights)


def test_portable_cpu_build_matches_oracle():
    """The kernel's portable (non-AVX2) build, which this AVX2 machine would otherwise never run."""
    script = (
        "import sys, torch; sys.path.insert(0, sys.argv[1])\n"
        "from aggregation_cases import random_federation\n"
        "from test_fused import run_fused\n"
        "from test_reference import assert_matches_oracle\n"
        "for dtype in (torch.float32, torch.float64):\n"
        "    for nested, rolling in ((True, False), (False, False), (True, True), (False, True)):\n"
        "        f = random_federation(7, 9, dtype=dtype, nested=nested, rolling=rolling)\n"
        "        assert_matches_oracle(run_fused(f), f, dtype)\n"
        "print('ok')\n")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, HASFL_PORTABLE_CPU_KERNEL="1")
    done = subprocess.run([sys.executable, "-c", script, here], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_fused_availability_is_per_device():
    from hasfl_ray.aggregation import fused_available

    assert fused_available() and fused_available("cpu")
    assert fused_available("cuda") == ops.cuda_available()
    assert not fused_available("meta")


def test_auto_falls_back_where_no_kernel_exists(monkeypatch):
    import hasfl_ray.aggregation as aggregation

    monkeypatch.setattr(ops, "cuda_available", lambda: False)
    assert not aggregation.fused_available("cuda") and aggregation.fused_available("cpu")
    monkeypatch.setattr(aggregation, "fused_available", lambda device=None: device is None)
    federation = random_federation(seed=8, num_clients=3, dtype=torch.float64)
    args = (federation.shapes, federation.updates, federation.weights, federation.gate_blocks)
    result = aggregate_updates(*args, backend="auto")  # falls back to the reference
    assert_matches_oracle(result, federation, torch.float64)
    with pytest.raises(RuntimeError, match="no kernel for updates on cpu"):
        aggregate_updates(*args, backend="fused")


@pytest.mark.skipif(not ops.available(), reason="needs the compiled extension hasfl_ray._C")
def test_slices_holding_nans_of_both_signs_give_the_canonical_nan_in_every_build():
    """Nested slices (the kernel's mean-by-inverse path) holding -NaN and NaN on one coordinate: the mean and both
    norms are the canonical NaN (0x7fc00000 in float32), as the sparse path writes it; before, this CPU's build
    wrote -NaN (0xffc00000), the first operand of -NaN + NaN."""
    script = ("import torch\n"
              "from hasfl_ray.aggregation import aggregate_updates\n"
              "u = [{'w': torch.zeros(4, 300)}, {'w': torch.zeros(3, 200)}]\n"
              "u[0]['w'][1, 7], u[1]['w'][1, 7] = -float('nan'), float('nan')\n"
              "r = aggregate_updates({'w': (4, 300)}, u, [1.0, 2.0], backend='fused')\n"
              "nan = torch.isnan(r.delta['w'])\n"
              "print(int(nan.sum()), r.delta['w'][nan].view(torch.int32).item() & 0xffffffff,\n"
              "      r.div_num.view(torch.int64).tolist())\n")
    seen = stdout_in_each_build(script)
    nan64 = torch.tensor([float("nan")], dtype=torch.float64).view(torch.int64).item()
    assert seen == {f"1 {0x7fc00000} {[nan64, nan64]}"}
