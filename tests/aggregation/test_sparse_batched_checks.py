"""Index-set and mask updates checked and laid out for the fused kernel a parameter at a time, all holders at once
(hasfl_ray.aggregation.packed.contents_hold, hasfl_ray.ops.sparse.build_sparse_layout), where they were a holder at
a time: the same inputs pass, the same first defect is named in the same sentence, and every entry of the layout
holds exactly the coordinates its update holds."""

import math
import random

import numpy as np
import pytest
import torch

from hasfl_ray.aggregation import IndexedUpdate, MaskedUpdate, validate_inputs
from hasfl_ray.aggregation.packed import check_packed, contents_hold, dense_of
from hasfl_ray.ops import aggregate as dense_ops
from hasfl_ray.ops.sparse import build_sparse_layout

SHAPES = {"conv": (6, 4, 3, 3), "bias": (8,), "fc": (4, 700), "gates": (6, 5), "one": (), "none": (0, 3),
          "odd": (3, 7)}  # "odd": 21 coordinates, a bitmask with 3 padding bits


def _index_set(full, rng, generator):
    index = []
    for size in full:
        if rng.random() < 0.3:
            index.append(None)
        else:
            index.append(torch.sort(torch.randperm(size, generator=generator)[:rng.randint(0, size)]).values)
    shape = tuple(size if chosen is None else len(chosen) for chosen, size in zip(index, full))
    return IndexedUpdate(torch.randn(shape, generator=generator), tuple(index))


def _mask(full, rng, generator):
    return MaskedUpdate.gather(torch.randn(full, generator=generator), torch.rand(full, generator=generator) <
                               rng.random())


def _federation(seed, kinds=("slice", "index", "mask")):
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    updates = []
    for _ in range(rng.randint(2, 7)):
        update = {}
        for name, full in SHAPES.items():
            kind = rng.choice(kinds + ("absent",))
            if kind == "slice" or (kind == "index" and not full):
                shape = tuple(rng.randint(1, size) if size else 0 for size in full)
                if name == "gates":
                    shape = (2 * rng.randint(1, 3), shape[1])
                update[name] = torch.randn(shape, generator=generator)
            elif kind == "index":
                update[name] = _index_set(full, rng, generator)
            elif kind == "mask":
                update[name] = _mask(full, rng, generator)
        updates.append(update)
    return updates


def _spoil(packed, full, rng):
    """``packed`` with one defect that only a pass over its index lists or bitmask finds (or None: it has none to
    spoil)."""
    if isinstance(packed, IndexedUpdate):
        dims = [dim for dim, chosen in enumerate(packed.index) if chosen is not None and len(chosen)]
        if not dims:
            return None
        dim = rng.choice(dims)
        chosen = packed.index[dim].clone()
        how = rng.choice(["negative", "past the end", "repeated", "swapped"])
        if how == "negative":
            chosen[0] = -1
        elif how == "past the end":
            chosen[-1] = full[dim]
        elif how == "repeated" and len(chosen) > 1:
            chosen[1] = chosen[0]
        elif len(chosen) > 1:
            chosen[[0, 1]] = chosen[[1, 0]]
        else:
            chosen[0] = full[dim] + 3
        return IndexedUpdate(packed.values, packed.index[:dim] + (chosen,) + packed.index[dim + 1:])
    numel = math.prod(full)
    how = rng.choice(["padding", "one value short", "one value more", "two dims"])
    if how == "padding" and numel % 8:
        bits = packed.bits.clone()
        bits[-1] |= 0x80
        return MaskedUpdate(packed.values, bits)
    if how == "one value short" and packed.values.numel():
        return MaskedUpdate(packed.values[1:].contiguous(), packed.bits)
    if how == "two dims":
        return MaskedUpdate(packed.values.reshape(1, -1), packed.bits)
    return MaskedUpdate(torch.cat([packed.values, packed.values[:1] + 1]) if packed.values.numel() else
                        torch.ones(1, dtype=packed.values.dtype), packed.bits)


def _first_sentence(updates):
    """What checking one holder at a time, clients in order, says first (None: nothing)."""
    for client, update in enumerate(updates):
        for name, packed in update.items():
            if isinstance(packed, (IndexedUpdate, MaskedUpdate)):
                try:
                    check_packed(f"updates[{client}][{name!r}]", SHAPES[name], packed)
                except (ValueError, TypeError) as error:
                    return str(error)
    return None


@pytest.mark.parametrize("seed", range(40))
def test_a_spoiled_holder_is_named_as_one_holder_at_a_time_names_it(seed):
    rng = random.Random(1000 + seed)
    updates = _federation(seed)
    sparse = [(client, name) for client, update in enumerate(updates) for name, packed in update.items()
              if isinstance(packed, (IndexedUpdate, MaskedUpdate))]
    rng.shuffle(sparse)
    for client, name in sparse:
        spoiled = _spoil(updates[client][name], SHAPES[name], rng)
        if spoiled is not None:
            updates[client][name] = spoiled
            break
    else:
        pytest.fail(f"seed {seed} gave no holder to spoil")
    expected = _first_sentence(updates)
    assert expected is not None and f"updates[{client}][{name!r}]" in expected
    with pytest.raises((ValueError, TypeError)) as raised:
        validate_inputs(SHAPES, updates, [1.0] * len(updates), {"gates": 2})
    assert str(raised.value) == expected


@pytest.mark.parametrize("seed", range(60))
def test_all_holders_at_once_pass_exactly_what_one_at_a_time_passes(seed):
    """Holders of one parameter, each spoiled or not at random, the lists of the unspoiled ones chosen to sit right
    beside one another in the concatenation (a list ending high followed by one starting at 0 is fine)."""
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    name = rng.choice([name for name, full in SHAPES.items() if full])
    full = SHAPES[name]
    make = _index_set if rng.random() < 0.5 else _mask
    packs = [make(full, rng, generator) for _ in range(rng.randint(1, 6))]
    packs = [(_spoil(p, full, rng) or p) if rng.random() < 0.2 else p for p in packs]
    one_at_a_time = _first_sentence([{name: p} for p in packs]) is None
    assert contents_hold(full, packs) == one_at_a_time


def test_index_lists_meeting_at_the_concatenation_are_each_checked_alone():
    full = (9, 2)
    ending_high = IndexedUpdate(torch.zeros(2, 2), (torch.tensor([7, 8]), None))
    starting_low = IndexedUpdate(torch.zeros(2, 2), (torch.tensor([0, 1]), None))
    empty = IndexedUpdate(torch.zeros(0, 2), (torch.zeros(0, dtype=torch.int64), None))
    repeated_at_start = IndexedUpdate(torch.zeros(2, 2), (torch.tensor([3, 3]), None))
    assert contents_hold(full, [ending_high, empty, starting_low, empty])
    assert not contents_hold(full, [ending_high, empty, repeated_at_start])
    assert not contents_hold(full, [starting_low, IndexedUpdate(torch.zeros(1, 2), (torch.tensor([9]), None))])


def _held_by_entry(layout, entry):
    """The flat coordinates (of the parameter's full shape) that entry ``entry`` of the layout says it holds."""
    row = layout.entries[entry].numpy()
    param = layout.params[row[dense_ops._ENTRY_PARAM]].numpy()
    ndim = int(param[dense_ops._PARAM_NDIM])
    dims = [int(size) for size in param[dense_ops._PARAM_FULL:dense_ops._PARAM_FULL + ndim]]
    lists = []
    for dim in range(ndim - 1):
        start = int(layout.row_offsets[entry, dim])
        lists.append(layout.rows[start:start + int(row[dense_ops._ENTRY_PACKED + dim])].numpy())
    last = np.unpackbits(layout.bits[entry].numpy(), count=dims[-1], bitorder="little").astype(bool)
    lists.append(np.flatnonzero(last))
    assert int(row[dense_ops._ENTRY_PACKED + ndim - 1]) == last.sum()
    grid = np.meshgrid(*lists, indexing="ij")
    return set(np.ravel_multi_index([g.ravel() for g in grid], dims).tolist()) if all(map(len, lists)) else set()


@pytest.mark.parametrize("seed", range(30))
def test_every_entry_of_the_layout_holds_what_its_update_holds(seed):
    updates = _federation(seed)
    shapes = {name: full for name, full in SHAPES.items() if any(name in update for update in updates)}
    blocks = {"gates": 2} if "gates" in shapes else {}
    layout = build_sparse_layout(shapes, updates, blocks)
    checked = 0
    for entry in range(len(layout.packed)):
        row = layout.entries[entry].numpy()
        name = layout.names[row[dense_ops._ENTRY_PARAM]]
        packed = updates[row[dense_ops._ENTRY_CLIENT]][name]
        if not layout.kinds[row[dense_ops._ENTRY_PARAM]]:
            continue  # a dense parameter: hasfl_ray.ops.aggregate's layout, tested there
        values = packed if isinstance(packed, torch.Tensor) else packed.values
        assert layout.packed[entry] is values
        if isinstance(packed, torch.Tensor):  # a slice beside index sets or masks
            mask = torch.zeros(SHAPES[name] or (1,), dtype=torch.bool)
            if name == "gates" and blocks:
                rows, held = SHAPES[name][0] // 2, packed.shape[0] // 2
                for block in range(2):
                    mask[block * rows:block * rows + held, :packed.shape[1]] = True
            else:
                mask[tuple(slice(0, size) for size in packed.shape)] = True
        else:
            mask = dense_of(packed, SHAPES[name])[1]
        assert _held_by_entry(layout, entry) == set(np.flatnonzero(mask.reshape(-1).numpy()).tolist())
        checked += 1
    assert checked


@pytest.mark.parametrize("full", [(3, 7), (4097, 9)], ids=["small bitmasks, stacked", "large, one at a time"])
def test_a_padding_bit_or_a_count_off_by_one_in_any_holder_fails_the_group(full):
    generator = torch.Generator().manual_seed(5)
    good = [MaskedUpdate.gather(torch.randn(full, generator=generator), torch.rand(full, generator=generator) < 0.4)
            for _ in range(3)]
    assert contents_hold(full, good)
    for spoiled in range(3):
        padded = good[spoiled].bits.clone()
        padded[-1] |= 0x80  # 21 and 36873 coordinates: bit 7 of the last byte is padding
        packs = list(good)
        values = good[spoiled].values
        packs[spoiled] = MaskedUpdate(torch.cat([values, values[:1]]), padded)  # the count of bits and values agree
        assert not contents_hold(full, packs)
        packs[spoiled] = MaskedUpdate(good[spoiled].values[1:].contiguous(), good[spoiled].bits)
        assert not contents_hold(full, packs)
