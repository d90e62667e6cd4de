"""Index-set and mask updates used as a hostile researcher would (h50): a parameter with no coordinates held as a
mask, a bitmask that is a strided view, index lists that do not fit handed to ``IndexedUpdate.gather``. Each is
either the float64 dense oracle's answer or one sentence naming the thing."""

import pytest
import torch

from hasfl_ray.aggregation import IndexedUpdate, MaskedUpdate, aggregate_updates
from hasfl_ray.aggregation.packed import pack_bits
from test_sparse import BACKENDS, assert_matches, oracle


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_parameter_of_no_coordinates_held_as_a_mask_matches_the_oracle(backend, dtype):
    """An empty tensor (shape (0, 3)) held as a mask by one client and as a slice by another, beside a real masked
    parameter: the fused kernel's table gave it one coordinate it has not ("params[0] writes [0, 1) but out has 0
    elements")."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(5, 7, generator=g, dtype=dtype)
    shapes = {"empty": (0, 3), "w": (5, 7)}
    updates = [{"empty": MaskedUpdate(torch.zeros(0, dtype=dtype), torch.zeros(0, dtype=torch.uint8)),
                "w": MaskedUpdate.gather(w, torch.rand(5, 7, generator=g) < 0.5)},
               {"empty": torch.zeros(0, 3, dtype=dtype), "w": w[:3, :4].contiguous()}]
    result = aggregate_updates(shapes, updates, [1.0, 3.0], backend=backend)
    assert result.delta["empty"].shape == (0, 3)
    assert_matches(result, oracle(shapes, updates, [1.0, 3.0], {}), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_strided_bitmask_is_named_as_not_contiguous(backend):
    mask = torch.rand(4, 6) < 0.5
    strided = torch.stack([pack_bits(mask)] * 2, dim=1)[:, 0]
    with pytest.raises(ValueError) as raised:
        aggregate_updates({"w": (4, 6)}, [{"w": MaskedUpdate(torch.zeros(int(mask.sum())), strided)}], [1.0],
                          backend=backend)
    assert str(raised.value) == ("updates[0]['w'].bits is not contiguous (strides (2,)); expected a contiguous "
                                 "bitmask")


@pytest.mark.parametrize("index, error, sentence", [
    ((torch.tensor([0, 9]), None), ValueError,
     "index[0] holds index 9, outside dim 0 of size 6 of the global shape (6, 10); expected indices in [0, 6)"),
    ((torch.tensor([0, 1], dtype=torch.int32), None), TypeError,
     "index[0] is dtype torch.int32 and 1 dims; expected a 1-D torch.int64 tensor or None"),
    ((torch.tensor([0, 1]), None, None), ValueError, "index has 3 entries; expected one per dim of the shape (6, 10)"),
    ((None, torch.tensor([3, 3])), ValueError,
     "index[1] is [3, 3], which is not strictly increasing; expected sorted indices without duplicates"),
])
def test_gather_with_index_lists_that_do_not_fit_is_one_sentence(index, error, sentence):
    """IndexedUpdate.gather raised torch's "index out of range in self" for an index outside the tensor and built
    updates with int32 or surplus index lists that only the aggregation refused later."""
    with pytest.raises(error) as raised:
        IndexedUpdate.gather(torch.randn(6, 10), index)
    assert str(raised.value) == sentence


def test_gather_with_fitting_index_lists_is_the_product_of_the_lists():
    full = torch.arange(60.0).reshape(6, 10)
    update = IndexedUpdate.gather(full, (torch.tensor([1, 4]), torch.tensor([0, 9])))
    assert torch.equal(update.values, torch.tensor([[10.0, 19.0], [40.0, 49.0]]))
    assert torch.equal(IndexedUpdate.gather(full, (None, None)).values, full)


@pytest.mark.parametrize("backend", BACKENDS)
def test_updates_that_require_grad_give_a_plain_delta_on_every_backend(backend):
    """Deltas cut from parameters autograd tracks (``p - p0`` of ``nn.Parameter``s): the reference returned a delta
    that required grad, holding the whole graph (the fused op a plain tensor), so ``w + delta`` in a loop of rounds
    grew a graph round after round."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(5, 7, generator=g).requires_grad_()
    shapes = {"w": (5, 7), "b": (5,)}
    updates = [{"w": IndexedUpdate(w[[0, 3]], (torch.tensor([0, 3]), None)), "b": torch.ones(5, requires_grad=True)},
               {"w": MaskedUpdate.gather(w, torch.rand(5, 7, generator=g) < 0.5)},
               {"w": w[:2, :3].contiguous()}]
    result = aggregate_updates(shapes, updates, [1.0, 2.0, 3.0], backend=backend)
    assert not any(delta.requires_grad for delta in result.delta.values())
    assert not result.div_num.requires_grad and not result.div_den.requires_grad
    plain = [{name: (packed.detach() if isinstance(packed, torch.Tensor) else
                     type(packed)(packed.values.detach(), *[getattr(packed, f) for f in ("index", "bits")
                                                             if hasattr(packed, f)]))
              for name, packed in update.items()} for update in updates]
    assert_matches(result, oracle(shapes, plain, [1.0, 2.0, 3.0], {}), torch.float32)


@pytest.mark.parametrize("mask,words", [
    (torch.eye(4, 6, dtype=torch.bool).to_sparse(), "is a torch.sparse_coo tensor; expected a dense (strided"),
    (torch.ones(4, 6, dtype=torch.bool, device="meta"), "is on meta, a tensor without values"),
])
def test_a_sparse_or_meta_mask_is_one_sentence_when_gathered(mask, words):
    """`MaskedUpdate.gather` (and `extract_masked`) with a bool mask of the right shape stored sparse or on meta
    raised torch's "reshape is not implemented for sparse tensors" / a meta tensor's error (h62)."""
    with pytest.raises(ValueError) as raised:
        MaskedUpdate.gather(torch.zeros(4, 6), mask)
    assert str(raised.value).startswith("mask ") and words in str(raised.value)
    assert str(raised.value).endswith("of the parameter's shape (4, 6)")
