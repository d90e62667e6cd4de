"""hasfl_ray._C's direct entries of the fused ops (hasfl_ray/ops/calls.py): the same results as torch.ops bit for
bit, the same errors, and torch.ops where the direct entry cannot be taken (torch.compile, an older extension)."""

import sys
import types

import pytest
import torch

from hasfl_ray.aggregation import validate_inputs
from hasfl_ray.ops import aggregate as ops
from hasfl_ray.ops import calls
from hasfl_ray.ops.sparse import build_sparse_layout
from test_sparse import random_round

needs_direct = pytest.mark.skipif(
    not (ops.available() and hasattr(sys.modules.get("hasfl_ray._C"), "aggregate_sparse_into")),
    reason="needs the compiled extension hasfl_ray._C with its direct entries (pip install -e .)")


def dense_round(seed, dtype):
    shapes, updates, weights, blocks = random_round(seed, 9, dtype, kinds=("slice",))
    weights_t = validate_inputs(shapes, updates, weights, blocks)[1]
    return ops.build_layout(shapes, updates, blocks), weights_t


def run_dense(layout, weights, direct):
    out = torch.full((layout.total_numel,), float("nan"), dtype=layout.packed[0].dtype)
    result = calls.aggregate_into(out, layout.packed, layout.params, layout.entries, weights, direct=direct)
    return out, result


def run_sparse(layout, weights, direct):
    out = torch.full((layout.total_numel,), float("nan"), dtype=layout.packed[0].dtype)
    result = calls.aggregate_sparse_into(out, layout.packed, layout.params, layout.entries, weights, layout.kinds,
                                         layout.bits, layout.rows, layout.row_offsets, direct=direct)
    return out, result


def assert_same(a, b):
    (out_a, result_a), (out_b, result_b) = a, b
    assert torch.equal(out_a, out_b) and torch.equal(torch.signbit(out_a), torch.signbit(out_b))
    for x, y in zip(result_a, result_b):
        assert x.dtype == y.dtype and torch.equal(x, y)


@needs_direct
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_direct_dense_entry_equals_torch_ops_bit_for_bit(seed, dtype):
    layout, weights = dense_round(seed, dtype)
    assert_same(run_dense(layout, weights, True), run_dense(layout, weights, False))


@needs_direct
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_direct_sparse_entry_equals_torch_ops_bit_for_bit(seed, dtype):
    shapes, updates, weights, blocks = random_round(seed, 9, dtype)  # slices, index sets and masks in one round
    weights_t = validate_inputs(shapes, updates, weights, blocks)[1]
    layout = build_sparse_layout(shapes, updates, blocks)
    assert_same(run_sparse(layout, weights_t, True), run_sparse(layout, weights_t, False))


@needs_direct
def test_the_direct_entry_raises_what_torch_ops_raises():
    layout, weights = dense_round(0, torch.float32)
    messages = []
    for direct in (True, False):
        with pytest.raises(RuntimeError) as raised:
            run_dense(layout, weights.float(), direct)  # float32 weights: refused by the op's first check
        messages.append(str(raised.value).splitlines()[0])
    assert messages[0] == messages[1] and "weights must be a contiguous 1-D float64 CPU tensor" in messages[0]


@needs_direct
def test_the_direct_entry_names_an_argument_that_is_not_a_tensor():
    layout, weights = dense_round(0, torch.float32)
    out = torch.empty(layout.total_numel)
    packed = list(layout.packed)
    packed[3] = "not a tensor"
    with pytest.raises(TypeError, match=r"packed\[3\] is a str; expected a torch.Tensor"):
        calls.aggregate_into(out, packed, layout.params, layout.entries, weights, direct=True)
    with pytest.raises(TypeError, match="weights is a list; expected a torch.Tensor"):
        calls.aggregate_into(out, layout.packed, layout.params, layout.entries, [1.0], direct=True)
    with pytest.raises(TypeError, match="list or tuple of tensors"):
        calls.aggregate_into(out, 7, layout.params, layout.entries, weights, direct=True)


@needs_direct
def test_torch_ops_is_taken_under_torch_compile_and_with_an_older_extension(monkeypatch):
    layout, weights = dense_round(1, torch.float32)
    expected = run_dense(layout, weights, False)
    taken = []
    real = torch.ops.hasfl_ray.aggregate_into

    class Spy:
        def __call__(self, *args):
            taken.append("torch.ops")
            return real(*args)

    monkeypatch.setattr(torch.ops.hasfl_ray, "aggregate_into", Spy())
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert_same(run_dense(layout, weights, None), expected)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    assert_same(run_dense(layout, weights, None), expected)  # the direct entry: torch.ops not called
    monkeypatch.setitem(sys.modules, "hasfl_ray._C", types.ModuleType("hasfl_ray._C"))  # built before the entries
    assert_same(run_dense(layout, weights, None), expected)
    assert taken == ["torch.ops", "torch.ops"]
    with pytest.raises(RuntimeError, match="no direct entry aggregate_into"):
        run_dense(layout, weights, True)
