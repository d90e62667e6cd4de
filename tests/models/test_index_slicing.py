"""Channel index sets and masks as sub-models (issue 44 item 1 a/b): the slicer, the narrower network it trains,
the trainer's packed update, the wire and the checkpoint form."""

import math

import os

import pytest
import torch

from hasfl_ray.aggregation import IndexedUpdate, MaskedUpdate, aggregate_updates
from hasfl_ray.engine.async_state import result_from_dict, result_to_dict
from hasfl_ray.models import build_model
from hasfl_ray.models.index_slicing import (channel_groups, check_masks, extract_indexed, extract_masked,
                                            index_sets, insert_indexed_, insert_masked_, random_channel_sets)
from hasfl_ray.simulation.wire import pack, unpack
from hasfl_ray.training.result import ClientResult


def test_channel_groups_of_the_cnn_chain():
    groups, sizes = channel_groups(build_model("emnist").param_specs())
    assert sizes == [64, 64, 128, 128, 256, 256, 512]
    assert groups[("features.3.weight", 1)] == groups[("features.0.weight", 0)] == groups[("features.1.bias", 0)] == 0
    assert groups[("fc1.weight", 1)] == 5 and groups[("fc1.weight", 0)] == 6 and groups[("fc2.weight", 1)] == 6
    assert ("fc2.weight", 0) not in groups


def test_index_sets_follow_into_the_next_layer_and_a_flattened_dim():
    specs = build_model("emnist").param_specs()
    channels = [[0, 5], [1, 2, 63], [0], [3], [7], [2, 255], [9, 10, 11]]
    sets = index_sets(specs, channels)
    assert sets["features.3.weight"][0].tolist() == [1, 2, 63] and sets["features.3.weight"][1].tolist() == [0, 5]
    assert sets["features.3.weight"][2] is None and sets["features.0.weight"][1] is None
    # fc1's input is 256 channels x 16 positions (4x4 after flattening): channel c covers 16c .. 16c + 15.
    assert sets["fc1.weight"][1].tolist() == list(range(32, 48)) + list(range(255 * 16, 256 * 16))
    assert sets["fc2.weight"][0] is None and sets["fc2.weight"][1].tolist() == [9, 10, 11]


@torch.no_grad()
def test_narrow_network_of_gathered_channels_computes_the_masked_full_network():
    """The width-p network loaded with the gathered channels gives the logits of the full network whose other
    channels are zeroed: the sub-model is exactly the chosen channels."""
    torch.manual_seed(0)
    full = build_model("emnist").eval()
    specs = full.param_specs()
    width = 0.5
    channels = random_channel_sets(specs, width, torch.Generator().manual_seed(3))
    sets = index_sets(specs, channels)
    packed = extract_indexed(dict(full.named_parameters()), sets)
    narrow = build_model("emnist", width=width).eval()
    for name, param in narrow.named_parameters():
        param.copy_(packed[name].values)
    zeroed = {name: torch.zeros_like(p) for name, p in full.named_parameters()}
    insert_indexed_(zeroed, packed)
    for name, param in full.named_parameters():
        param.copy_(zeroed[name])
    x = torch.randn(5, 1, 28, 28)
    torch.testing.assert_close(narrow(x), full(x), rtol=1e-5, atol=1e-5)


def test_masks_extract_and_insert_round_trip():
    specs = build_model("emnist").param_specs()
    params = {name: torch.randn(spec.shape) for name, spec in specs.items()}
    masks = {name: torch.rand(spec.shape) < 0.3 for name, spec in specs.items()}
    check_masks(specs, masks)
    packed = extract_masked(params, masks)
    assert all(p.values.numel() == int(masks[n].sum()) for n, p in packed.items())
    back = {name: torch.zeros_like(t) for name, t in params.items()}
    insert_masked_(back, packed)
    for name in params:
        assert torch.equal(back[name], torch.where(masks[name], params[name], 0))


@pytest.mark.parametrize("channels,words", [
    ([[0, 64]] + [[0]] * 6, "channel_sets[0] holds channel 64, outside the layer's 64 channels"),
    ([[1, 1]] + [[0]] * 6, "channel_sets[0] is not strictly increasing"),
    ([[2, 1]] + [[0]] * 6, "channel_sets[0] is not strictly increasing"),
    ([[0]] * 6, "channel_sets has 6 lists; expected one per channel group (7)"),
])
def test_bad_channel_sets_are_one_sentence(channels, words):
    with pytest.raises(ValueError) as raised:
        index_sets(build_model("emnist").param_specs(), channels)
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_bad_masks_are_one_sentence():
    specs = build_model("emnist").param_specs()
    with pytest.raises(ValueError, match=r"masks\['fc2.bias'\] has shape \(61,\) and dtype torch.bool; expected a "
                                         r"torch.bool tensor of shape \(62,\)"):
        check_masks(specs, {"fc2.bias": torch.ones(61, dtype=torch.bool)})
    with pytest.raises(ValueError, match=r"dtype torch.float32"):
        check_masks(specs, {"fc2.bias": torch.ones(62)})


def model_round():
    """Three clients of the CNN: index sets at two widths and a mask, one leading slice."""
    specs = build_model("emnist").param_specs()
    generator = torch.Generator().manual_seed(1)
    full = [{name: torch.randn(spec.shape, generator=generator) for name, spec in specs.items()} for _ in range(4)]
    updates = [extract_indexed(full[0], index_sets(specs, random_channel_sets(specs, 0.5, generator))),
               extract_indexed(full[1], index_sets(specs, random_channel_sets(specs, 0.25, generator))),
               extract_masked(full[2], {name: torch.rand(spec.shape, generator=generator) < 0.2
                                        for name, spec in specs.items()}),
               {name: full[3][name][tuple(slice(0, s) for s in spec.sliced_shape(0.5))].contiguous()
                for name, spec in specs.items()}]
    return {name: spec.shape for name, spec in specs.items()}, updates


def test_wire_carries_index_sets_and_masks_packed_never_dense():
    shapes, updates = model_round()
    results = [ClientResult(i, 0.5, update, 10, 1.0, 1) for i, update in enumerate(updates)]
    wired = pack(results)
    dense = sum(math.prod(shape) * 4 for shape in shapes.values())
    for result, update in zip(results, updates):
        held = sum(p.nbytes() if not isinstance(p, torch.Tensor) else p.numel() * 4 for p in update.values())
        assert held < dense
    assert wired.buffer.nbytes < 3 * dense  # four clients, none of them dense
    back = unpack(wired)
    for result, got in zip(results, back):
        for name, packed in result.update.items():
            other = got.update[name]
            assert type(other) is type(packed)
            if isinstance(packed, IndexedUpdate):
                assert torch.equal(other.values, packed.values)
                assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(other.index, packed.index))
            elif isinstance(packed, MaskedUpdate):
                assert torch.equal(other.values, packed.values) and torch.equal(other.bits, packed.bits)


def test_checkpoint_form_loads_with_weights_only(tmp_path):
    shapes, updates = model_round()
    result = ClientResult(2, 0.5, {**updates[0], **{"fc2.bias": updates[2]["fc2.bias"]}}, 10, 1.0, 1)
    torch.save(result_to_dict(result), tmp_path / "r.pt")
    back = result_from_dict(torch.load(tmp_path / "r.pt", weights_only=True))
    assert isinstance(back.update["fc2.bias"], MaskedUpdate) and isinstance(back.update["fc1.weight"], IndexedUpdate)
    assert torch.equal(back.update["fc1.weight"].values, result.update["fc1.weight"].values)


@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_a_model_round_of_mixed_shapes_aggregates_like_the_oracle(backend):
    from hasfl_ray.ops import aggregate as ops

    if backend == "fused" and not (ops.available() and hasattr(torch.ops.hasfl_ray, "aggregate_sparse_into")):
        pytest.skip("needs hasfl_ray._C built with aggregate_sparse_into")
    import sys, os
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "aggregation"))
    from test_sparse import assert_matches, oracle

    shapes, updates = model_round()
    weights = [1.0, 2.0, 0.5, 3.0]
    result = aggregate_updates(shapes, updates, weights, backend=backend)
    assert_matches(result, oracle(shapes, updates, weights, {}), torch.float32)


def test_a_recurrent_model_is_not_a_channel_chain():
    with pytest.raises(ValueError, match=r"^parameter 'lstm.weight_ih_l0' is 4 blocks in dim 0 \(an RNN's "
                                         r"gates, q/k/v or slice_blocks\); expected a "
                                         r"sequential conv/linear chain, whose parameters have none$"):
        channel_groups(build_model("shakespeare").param_specs())


def test_a_model_whose_blocks_are_declared_is_not_called_recurrent():
    """examples/tiny_vit.py's q/k/v projection is 3 blocks by its slice_blocks: channel sets for it were refused as
    "has gate blocks (a recurrent layer)", a layer the ViT does not have (h62)."""
    from hasfl_ray.models.plugin import derive_specs, load_factory

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    specs = derive_specs(load_factory(os.path.join(repo, "examples", "tiny_vit.py") + ":TinyViT"),
                         dict(in_channels=1, image_size=8, num_classes=10))
    with pytest.raises(ValueError, match=r"^parameter 'blocks.0.qkv.weight' is 3 blocks in dim 0 \(.*slice_blocks\)"):
        channel_groups(specs)


def test_extracting_a_parameter_the_model_lacks_is_one_sentence():
    """extract_masked / extract_indexed raised a bare KeyError of the name (h50)."""
    params = {"fc.weight": torch.zeros(3, 4), "fc.bias": torch.zeros(3)}
    with pytest.raises(ValueError, match=r"^masks names 'nope', which params does not have; expected names of "
                                         r"fc.weight, fc.bias$"):
        extract_masked(params, {"nope": torch.ones(3, dtype=torch.bool)})
    with pytest.raises(ValueError, match=r"^sets names 'other.weight', which params does not have"):
        extract_indexed(params, {"other.weight": (None, None)})
