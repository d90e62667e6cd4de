"""Bad aggregation inputs raise ValueError/TypeError with one sentence naming the argument, on every backend."""

import pytest
import torch

from hasfl_ray.aggregation import aggregate_updates
from hasfl_ray.ops.aggregate import build_layout

SHAPES = {"w": (4, 3), "b": (4,), "g": (8, 2)}
BLOCKS = {"g": 4}


def good_update():
    return {"w": torch.zeros(2, 3), "b": torch.zeros(2), "g": torch.zeros(4, 2)}


def with_value(name, value):
    update = good_update()
    update[name] = value
    return update


BAD_INPUTS = {
    "packed larger than global": ([with_value("w", torch.zeros(5, 3))], [1.0], ValueError, "updates[0]['w']"),
    "packed wider than global": ([with_value("w", torch.zeros(2, 4))], [1.0], ValueError, "updates[0]['w']"),
    "wrong number of dims": ([with_value("w", torch.zeros(2, 3, 1))], [1.0], ValueError, "updates[0]['w']"),
    "gate blocks misfit": ([with_value("g", torch.zeros(3, 2))], [1.0], ValueError, "updates[0]['g']"),
    "integer dtype": ([with_value("b", torch.zeros(2, dtype=torch.int64))], [1.0], TypeError, "updates[0]['b']"),
    "half dtype": ([with_value("b", torch.zeros(2, dtype=torch.float16))], [1.0], TypeError, "updates[0]['b']"),
    "mixed dtypes": ([good_update(), with_value("b", torch.zeros(2, dtype=torch.float64))], [1.0, 1.0], TypeError,
                     "updates[1]['b']"),
    "mixed devices": ([good_update(), with_value("b", torch.zeros(2, device="meta"))], [1.0, 1.0], ValueError,
                      "updates[1]['b']"),
    "non-contiguous": ([with_value("w", torch.zeros(3, 2).t())], [1.0], ValueError, "updates[0]['w']"),
    "not a tensor": ([with_value("w", [[0.0] * 3] * 2)], [1.0], TypeError, "updates[0]['w']"),
    "unknown parameter": ([with_value("extra", torch.zeros(1))], [1.0], ValueError, "updates[0]['extra']"),
    "client not a mapping": ([torch.zeros(3)], [1.0], TypeError, "updates[0]"),
    "NaN weight": ([good_update(), good_update()], [1.0, float("nan")], ValueError, "weights"),
    "infinite weight": ([good_update()], [float("inf")], ValueError, "weights"),
    "zero weight": ([good_update()], [0.0], ValueError, "weights"),
    "negative weight": ([good_update()], [-2.0], ValueError, "weights"),
    "weights of the wrong length": ([good_update()], [1.0, 2.0], ValueError, "weights"),
    "weights of strings": ([good_update()], ["a"], TypeError, "weights is ['a']; expected one finite positive"),
    "weights None": ([good_update()], None, TypeError, "weights is None; expected one finite positive"),
    "weights a generator": ([good_update()], (w for w in [1.0]), TypeError, "weights is <generator"),
    "updates a generator": ((u for u in [good_update()]), [1.0], TypeError,
                            "updates is a generator; expected a list of per-client mappings"),
    "updates a mapping": ({"w": torch.zeros(2, 3)}, [1.0], TypeError,
                          "updates is a dict; expected a list of per-client mappings"),
    "tensors without values": ([{"b": torch.zeros(2, device="meta")}], [1.0], ValueError,
                               "updates[0]['b'] is on meta, a tensor without values; expected"),
    "empty client list": ([], [], ValueError, "updates"),
    "clients without tensors": ([{}, {}], [1.0, 1.0], ValueError, "updates"),
}


@pytest.mark.parametrize("backend", ["reference", "fused", "auto"])
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_raises_one_sentence_naming_the_argument(case, backend):
    updates, weights, error, argument = BAD_INPUTS[case]
    with pytest.raises(error) as raised:
        aggregate_updates(SHAPES, updates, weights, BLOCKS, backend=backend)
    message = str(raised.value)
    assert argument in message and "\n" not in message, message


@pytest.mark.parametrize("shapes,blocks,argument", [
    ({}, None, "global_shapes"),
    (SHAPES, {"nope": 2}, "gate_blocks"),
    (SHAPES, {"g": 3}, "gate_blocks['g']"),
])
def test_bad_shapes_and_blocks(shapes, blocks, argument):
    with pytest.raises(ValueError, match=argument.replace("[", r"\[")):
        aggregate_updates(shapes, [good_update()], [1.0], blocks)


def test_unknown_backend():
    with pytest.raises(ValueError, match="backend"):
        aggregate_updates(SHAPES, [good_update()], [1.0], BLOCKS, backend="gpu")


@pytest.mark.parametrize("offsets,argument", [
    ([{}, {}], "offsets has 2 entries"),
    ([{"w": (0, 3)}], r"offsets\[0\]\['w'\]"),
    ([{"w": (0,)}], r"offsets\[0\]\['w'\]"),
    ([{"g": (2, 0)}], r"offsets\[0\]\['g'\]"),
    ([{"w": (-1, 0)}], r"offsets\[0\]\['w'\]"),
    ([{"missing": (0,)}], r"offsets\[0\] names"),
])
def test_bad_rolling_offsets(offsets, argument):
    with pytest.raises(ValueError, match=argument):
        build_layout(SHAPES, [good_update()], BLOCKS, offsets)


@pytest.mark.parametrize("backend", ["fused", "reference"])
@pytest.mark.parametrize("shape", [(2.5, 3), (-1, 3), (True, 3), "ab", 5])
def test_a_global_shape_that_is_no_tuple_of_sizes_is_one_sentence(backend, shape):
    """(2.5, 3) was truncated to (2, 3) and aggregated; 'ab' and 5 were int()'s and iter()'s own errors; (-1, 3) said
    the update did not fit (h50)."""
    with pytest.raises(ValueError) as raised:
        aggregate_updates({"w": shape}, [{"w": torch.ones(1, 3)}], [1.0], backend=backend)
    assert str(raised.value) == f"global_shapes['w'] is {shape!r}; expected a tuple of non-negative integer sizes"


def test_global_shapes_of_torch_and_numpy_sizes_are_taken():
    import numpy as np

    for shape in (torch.Size([2, 3]), [np.int64(2), 3]):
        result = aggregate_updates({"w": shape}, [{"w": torch.ones(1, 3)}], [1.0], backend="reference")
        assert result.delta["w"].shape == (2, 3)


@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_gate_blocks_of_numpy_and_torch_integers_are_taken_and_a_bool_is_refused(backend):
    """`gate_blocks={"g": np.int64(4)}` was refused as "is np.int64(4); expected a positive integer dividing dim 0 of
    shape (8, 2)" (it is one), while global_shapes takes numpy sizes; `True` was taken as 1 block (h62)."""
    import numpy as np

    update = {"g": torch.arange(8.0).reshape(4, 2)}
    expected = aggregate_updates({"g": (8, 2)}, [update], [1.0], {"g": 4}, backend=backend).delta["g"]
    for blocks in (np.int64(4), torch.tensor(4)):
        result = aggregate_updates({"g": (8, 2)}, [update], [1.0], {"g": blocks}, backend=backend)
        assert torch.equal(result.delta["g"], expected)
    for bad in (True, 4.0, "4"):
        with pytest.raises(ValueError) as raised:
            aggregate_updates({"g": (8, 2)}, [update], [1.0], {"g": bad}, backend=backend)
        assert str(raised.value) == (f"gate_blocks['g'] is {bad!r}; expected a positive integer dividing dim 0 of "
                                      "shape (8, 2)")


def test_a_float_size_is_refused_after_the_same_shape_in_ints_was_cached():
    """The fused path's layout cache compared its key by value: after a call with (2, 3), `(2.0, 3)` (refused on its
    own, never truncated) hit the cached layout and was aggregated; so did a gate block count of 4.0 after 4 (h62)."""
    from hasfl_ray.ops import aggregate as ops

    if not ops.available():
        pytest.skip("needs hasfl_ray._C built (the fused op's layout cache)")
    update = {"w": torch.ones(1, 3)}
    aggregate_updates({"w": (2, 3)}, [update], [1.0], backend="fused")
    with pytest.raises(ValueError, match=r"^global_shapes\['w'\] is \(2.0, 3\); expected a tuple of non-negative"):
        aggregate_updates({"w": (2.0, 3)}, [update], [1.0], backend="fused")
    gates = {"g": torch.zeros(4, 2)}
    aggregate_updates({"g": (8, 2)}, [gates], [1.0], {"g": 4}, backend="fused")
    with pytest.raises(ValueError, match=r"^gate_blocks\['g'\] is 4.0; expected a positive integer"):
        aggregate_updates({"g": (8, 2)}, [gates], [1.0], {"g": 4.0}, backend="fused")
