"""The object-store wire format (hasfl_ray/simulation/wire.py): a structure's tensors as one buffer, back bit for
bit, against the tensors themselves."""

import dataclasses
import pickle

import numpy as np
import pytest
import torch

from hasfl_ray.simulation.wire import ALIGN, Packed, PackedTasks, pack, pack_units, unpack, unpack_units
from hasfl_ray.training.result import ClientResult
from hasfl_ray.training.task import ClientTask, LocalObjective


def random_result(generator: torch.Generator, client: int) -> ClientResult:
    shapes = [(3, 2, 3, 3), (3,), (7, 5), (1,), ()]
    update = {f"p{k}": torch.randn(shape, generator=generator, dtype=torch.float32) for k, shape in enumerate(shapes)}
    extras = {"drift": {"w": torch.randn(4, 4, generator=generator, dtype=torch.float64)},
              "counts": torch.randint(0, 9, (5,), generator=generator), "mask": torch.rand(6, generator=generator) > 0.5,
              "half": torch.randn(3, generator=generator).to(torch.float16), "note": "kept", "n": 3}
    return ClientResult(client, 0.5, update, 17, 0.25, 4, extras, offset=2, trained_width=0.4)


def assert_same(got, want):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape
        assert got.device.type == "cpu" and torch.equal(got.view(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8))
    elif isinstance(want, dict):
        assert type(got) is type(want) and list(got) == list(want)
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
    elif dataclasses.is_dataclass(want):
        assert type(got) is type(want)
        for f in dataclasses.fields(want):
            assert_same(getattr(got, f.name), getattr(want, f.name))
    else:
        assert got == want


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pack_and_unpack_give_back_every_tensor_bit_for_bit(seed):
    generator = torch.Generator().manual_seed(seed)
    results = tuple(random_result(generator, client) for client in range(4))
    packed = pickle.loads(pickle.dumps(pack(results)))  # as the object store would carry it
    assert isinstance(packed, Packed) and packed.buffer.dtype == np.uint8
    assert_same(unpack(packed), results)


def test_special_values_non_contiguous_and_empty_tensors_survive():
    base = torch.arange(24, dtype=torch.float32).view(4, 6)
    value = {"t": base.t(), "slice": base[:, 1::2], "empty": torch.zeros(0, 3), "scalar": torch.tensor(2.5),
             "special": torch.tensor([float("nan"), float("inf"), -0.0, -float("inf")]), "bf16": base.to(torch.bfloat16)}
    out = unpack(pack(value))
    for key in value:
        assert out[key].shape == value[key].shape and out[key].dtype == value[key].dtype
    assert torch.equal(out["t"], base.t()) and torch.equal(out["slice"], base[:, 1::2])
    assert torch.equal(out["special"].view(torch.int32), value["special"].view(torch.int32))  # NaN and -0.0 bits
    assert torch.equal(out["bf16"], value["bf16"]) and out["scalar"].item() == 2.5


def test_unpacked_tensors_are_private_aligned_and_writable():
    """The receiver may write into what it got (it never aliases the object store's read-only memory), and every
    tensor starts on an ALIGN-byte boundary of the buffer, so views of any dtype are valid."""
    value = {"a": torch.ones(3, dtype=torch.float16), "b": torch.ones(5, dtype=torch.float64)}
    packed = pack(value)
    packed.buffer.setflags(write=False)  # as Ray hands it out
    out = unpack(packed)
    out["b"].add_(1.0)
    assert torch.equal(out["b"], torch.full((5,), 2.0, dtype=torch.float64))
    assert all(slot.offset % ALIGN == 0 for slot in packed.skeleton.values())
    assert not np.shares_memory(out["b"].numpy(), packed.buffer)


def test_a_structure_of_only_empty_tensors_survives():
    # a server update whose every arrival was rejected (FedAsync's one NaN update) returns empty float64 tensors only:
    # a buffer of no bytes, which once failed to unpack ("self.stride(-1) must be 1 to view Byte as Double")
    value = {"covered": torch.zeros(0, dtype=torch.float64), "norms": torch.zeros(0, 2, dtype=torch.float64)}
    out = unpack(pack(value))
    assert {k: (t.shape, t.dtype) for k, t in out.items()} == {k: (t.shape, t.dtype) for k, t in value.items()}


def test_unpacked_tensors_are_contiguous_and_each_owns_its_own_bytes():
    """Every tensor comes back contiguous (its strides those of a fresh tensor of its shape) over its own bytes of
    the buffer: writing one leaves every other as it was."""
    generator = torch.Generator().manual_seed(3)
    value = {"a": torch.randn(2, 3, 4, generator=generator), "b": torch.randn(5, generator=generator),
             "c": torch.randn(3, 1, 2, generator=generator).to(torch.float64), "d": torch.tensor(1.5),
             "e": torch.randn(1, 7, generator=generator).to(torch.float16)}
    out = unpack(pack(value))
    for key, tensor in out.items():
        assert tensor.is_contiguous() and tensor.stride() == torch.empty(value[key].shape).stride()
    for key in out:
        out[key].fill_(0)
        for other in out:
            if other != key and other not in list(out)[:list(out).index(key)]:
                assert torch.equal(out[other], value[other])


def test_the_packed_bytes_are_a_function_of_the_tensors_alone_padding_included():
    """The up to 15 alignment bytes after each tensor are zeros, not whatever the process's memory held there (the
    buffer came from np.empty): packing the same tensors gives the same bytes."""
    values = {"a": torch.arange(3, dtype=torch.float32), "b": torch.ones(5, dtype=torch.float16)}
    first = pack(values).buffer
    for _ in range(20):  # freed buffers of the same size full of 0xFF, for the next allocation to reuse
        junk = np.full(first.size, 0xFF, dtype=np.uint8)
        del junk
    again = pack(values).buffer
    assert first.tobytes() == again.tobytes()
    assert not first[12:16].any() and not first[16 + 10:32].any()  # a's and b's padding


class _Views(LocalObjective):
    """An objective holding per-parameter views of one flat vector, as SCAFFOLD's correction does."""

    def __init__(self, flat):
        self.correction = {"a": flat[:6].view(2, 3), "b": flat[6:10]}
        self.scale = 0.5


class _OwnState(_Views):
    """An objective that pickles itself its own way: pack_units leaves it to pickle."""

    def __getstate__(self):
        return {"correction": self.correction, "scale": self.scale, "own": True}


def test_a_calls_tasks_travel_with_their_masks_and_objective_tensors_in_one_buffer_and_come_back_bit_for_bit():
    flat = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    bits = tuple((f"p{k}", torch.randint(0, 255, (7,), dtype=torch.uint8)) for k in range(3))
    units = [([ClientTask(0, 1, 0.5, 0.1, 7, objective=_Views(flat), masks=bits),
               ClientTask(1, 1, 1.0, 0.1, 8, objective=_OwnState(flat))], False),
             ([ClientTask(2, 1, 0.25, 0.1, 9)], True)]
    sent = pack_units(units)
    assert isinstance(sent, PackedTasks)
    first, own = sent.units[0][0]
    assert first.masks is None and vars(first.objective) == {} and own.objective is units[0][0][1].objective
    # the packed views hold their own bytes only (3 masks, 6 and 4 floats, each padded to 16 bytes), not the 100,000
    # floats of the vector they view (pickling a view takes its whole storage along, as the objective that pickles
    # itself still does)
    assert sent.state.buffer.nbytes == 3 * 16 + 32 + 16 and len(pickle.dumps(flat[6:10])) > 400_000
    back = unpack_units(pickle.loads(pickle.dumps(sent)))
    assert_same([[(t.client, t.masks, vars(t.objective) if t.client == 0 else None) for t in tasks]
                 for tasks, _ in back],
                [[(t.client, t.masks, vars(t.objective) if t.client == 0 else None) for t in tasks]
                 for tasks, _ in units])
    assert [batched for _, batched in back] == [False, True] and back[0][0][0].objective.scale == 0.5
    plain = [([ClientTask(3, 1, 1.0, 0.1, 1)], False)]
    assert pack_units(plain) is plain  # nothing to pack: the units as they are
