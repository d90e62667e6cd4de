"""Index-set and mask updates (issue 44 item 1 a/b): the fused kernel and the reference against a float64 dense
masked oracle written here with numpy, mixed shapes in one round included, and their bad inputs."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from hasfl_ray.aggregation import IndexedUpdate, MaskedUpdate, aggregate_updates
from hasfl_ray.aggregation.packed import count_bits, pack_bits, unpack_bits
from hasfl_ray.ops import aggregate as ops

needs_ext = pytest.mark.skipif(not (ops.available() and hasattr(torch.ops.hasfl_ray, "aggregate_sparse_into")),
                               reason="needs hasfl_ray._C built with aggregate_sparse_into")


def numpy_mask(full, packed, blocks):
    """The bool mask of the coordinates a client holds, from its description alone (numpy)."""
    mask = np.zeros(full, dtype=bool)
    if isinstance(packed, MaskedUpdate):
        bits = np.unpackbits(packed.bits.numpy(), bitorder="little")[:math.prod(full)]
        return bits.astype(bool).reshape(full)
    if isinstance(packed, IndexedUpdate):
        grids = [np.arange(s) if i is None else i.numpy() for i, s in zip(packed.index, full)]
    else:
        grids = [np.arange(s) for s in packed.shape]
        if blocks > 1:
            rows = full[0] // blocks
            grids[0] = np.concatenate([b * rows + np.arange(packed.shape[0] // blocks) for b in range(blocks)])
    mask[np.ix_(*grids)] = True
    return mask


def oracle(shapes, updates, weights, blocks):
    """Δ̄ and the divergence norms in float64, dense: values scattered by each client's own mask."""
    num, den = {}, {}
    held = []
    for update in updates:
        mine = {}
        for name, packed in update.items():
            full = shapes[name]
            mask = numpy_mask(full, packed, blocks.get(name, 1))
            values = (packed if isinstance(packed, torch.Tensor) else packed.values).double().numpy().ravel()
            dense = np.zeros(full)
            dense[mask] = values  # row-major over the held coordinates
            mine[name] = (dense, mask)
        held.append(mine)
    delta, div_num, div_den = {}, np.zeros(len(updates)), np.zeros(len(updates))
    for name, full in shapes.items():
        num, den = np.zeros(full), np.zeros(full)
        for w, mine in zip(weights, held):
            if name in mine:
                num += w * mine[name][0] * mine[name][1]
                den += w * mine[name][1]
        delta[name] = np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)
        for i, mine in enumerate(held):
            if name in mine:
                dense, mask = mine[name]
                div_num[i] += (((dense - delta[name]) * mask) ** 2).sum()
                div_den[i] += ((delta[name] * mask) ** 2).sum()
    return delta, div_num, div_den


def random_round(seed, num_clients, dtype, kinds=("slice", "index", "mask")):
    rng = np.random.default_rng(seed)
    shapes = {"conv": (24, 12, 3, 3), "bias": (24,), "wide": (6, 5000), "fc": (10, 96), "gates": (16, 8),
              "scalar": ()}
    blocks = {"gates": 4}
    updates = []
    for client in range(num_clients):
        kind = kinds[client % len(kinds)]
        update = {}
        for name, full in shapes.items():
            if rng.random() < 0.15:
                continue  # this client did not train it
            dense = torch.from_numpy(rng.standard_normal(full)).to(dtype)
            if kind == "slice" or (kind == "index" and name == "gates"):
                g = blocks.get(name, 1)
                shape = tuple(max(g, (int(rng.integers(1, s + 1)) // g) * g) if d == 0 else int(rng.integers(1, s + 1))
                              for d, s in enumerate(full))
                region = dense
                if g > 1:
                    rows = full[0] // g
                    region = torch.cat([dense[b * rows:b * rows + shape[0] // g] for b in range(g)])
                    shape = (shape[0],) + shape[1:]
                    update[name] = region[:, :shape[1]].contiguous()
                else:
                    update[name] = dense[tuple(slice(0, s) for s in shape)].contiguous()
            elif kind == "index":
                index = []
                for d, s in enumerate(full):
                    if d >= 2 or rng.random() < 0.2:
                        index.append(None)
                    else:
                        index.append(torch.from_numpy(np.sort(rng.choice(s, int(rng.integers(1, s + 1)),
                                                                         replace=False))).long())
                update[name] = IndexedUpdate.gather(dense, index)
            else:
                mask = torch.from_numpy(np.asarray(rng.random(full) < rng.uniform(0.05, 0.95)))
                update[name] = MaskedUpdate.gather(dense, mask)
        updates.append(update)
    weights = rng.uniform(0.5, 3.0, num_clients).tolist()
    return shapes, updates, weights, blocks


def opposite_nans_round(dtype):
    """random_round's masks with -NaN and NaN on one coordinate of a parameter the first two clients hold; returns
    the round and that parameter's name."""
    shapes, updates, weights, blocks = random_round(9, 4, dtype, ("mask",))
    name = next(n for n in shapes if all(n in u for u in updates[:2]) and shapes[n])
    for client, sign in ((0, -1.0), (1, 1.0)):
        packed = updates[client][name]
        values = packed.values.clone()
        values[0] = sign * float("nan")
        updates[client][name] = MaskedUpdate(values, packed.bits)
    return (shapes, updates, weights, blocks), name


def assert_matches(result, expected, dtype):
    delta, div_num, div_den = expected
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    for name, value in delta.items():
        torch.testing.assert_close(result.delta[name].double(), torch.from_numpy(value), **tol)
        assert result.delta[name].dtype == dtype
    torch.testing.assert_close(result.div_num, torch.from_numpy(div_num), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(result.div_den, torch.from_numpy(div_den), rtol=1e-9, atol=1e-9)


BACKENDS = [pytest.param("fused", marks=needs_ext), "reference"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kinds", [("index",), ("mask",), ("slice", "index", "mask")], ids=["index", "mask", "mixed"])
@pytest.mark.parametrize("num_clients", [1, 3, 11])
def test_sparse_matches_dense_oracle(backend, dtype, kinds, num_clients):
    shapes, updates, weights, blocks = random_round(7 * num_clients + len(kinds), num_clients, dtype, kinds)
    result = aggregate_updates(shapes, updates, weights, blocks, backend=backend)
    assert_matches(result, oracle(shapes, updates, weights, blocks), dtype)
    assert list(result.delta) == list(shapes)


def edge_round(dtype):
    """Edge cases in one call: an empty index set, all-false/all-true masks, a 1-D mask ending mid-word (131
    coordinates: 16 bytes + 3 bits) and rows of 300 columns (3 tiles, the last of 44)."""
    g = torch.Generator().manual_seed(3)
    shapes = {"w": (5, 300), "v": (131,), "c": (4, 3, 3, 3)}
    full = {name: torch.randn(shape, generator=g, dtype=dtype) for name, shape in shapes.items()}
    idx = lambda *v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    updates = [
        {"w": IndexedUpdate.gather(full["w"], (idx(), None)),  # holds nothing
         "v": MaskedUpdate.gather(full["v"], torch.zeros(131, dtype=torch.bool)),
         "c": IndexedUpdate.gather(full["c"], (idx(0, 3), idx(1), None, None))},
        {"w": MaskedUpdate.gather(full["w"], torch.ones(5, 300, dtype=torch.bool)),
         "v": MaskedUpdate.gather(full["v"], torch.arange(131) % 3 == 0),
         "c": full["c"][:2].contiguous()},
        {"w": IndexedUpdate.gather(full["w"] * 2, (idx(1, 4), idx(*range(100, 260)))),
         "v": MaskedUpdate.gather(full["v"] - 1, torch.ones(131, dtype=torch.bool))},
    ]
    return shapes, updates, [1.5, 0.5, 2.0], {}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparse_edge_cases_match_dense_oracle(backend, dtype):
    shapes, updates, weights, blocks = edge_round(dtype)
    for clients in (3, 1):  # one client, holding almost nothing, too
        result = aggregate_updates(shapes, updates[:clients], weights[:clients], blocks, backend=backend)
        assert_matches(result, oracle(shapes, updates[:clients], weights[:clients], blocks), dtype)


def word_round(dtype, num_clients):
    """Rows of several of the CPU kernel's 1024-column tiles and a partial last one, for its lists of held 16-column
    words: channel index sets whose columns come in runs of 16 aligned with the words (a linear layer's inputs from
    a conv's channels) or in runs of 9 (conv kernels), masks from nearly empty to full, and a client holding only
    the last coordinate of the flat tensor (its only word is the partial last one of the last tile)."""
    g = torch.Generator().manual_seed(5)
    shapes = {"fc": (3, 257, 16), "conv": (5, 200, 9), "flat": (2100,)}

    def channels(size, p):
        keep = torch.rand(size, generator=g) < p
        return torch.nonzero(keep).ravel() if keep.any() else torch.tensor([size - 1])

    updates = []
    for client in range(num_clients):
        full = {name: torch.randn(shape, generator=g, dtype=dtype) for name, shape in shapes.items()}
        p = (0.05, 0.25, 0.5, 1.0)[client % 4]
        mask = torch.rand(2100, generator=g) < (0.01, 0.3, 1.0)[client % 3]
        if client == num_clients - 1:
            mask = torch.arange(2100) == 2099
        updates.append({"fc": IndexedUpdate.gather(full["fc"], (channels(3, p), channels(257, p), None)),
                        "conv": IndexedUpdate.gather(full["conv"], (None, channels(200, p), None)),
                        "flat": MaskedUpdate.gather(full["flat"], mask)})
    return shapes, updates, [1.0 + 0.25 * client for client in range(num_clients)], {}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("num_clients", [2, 13])
def test_sparse_word_lists_match_dense_oracle(backend, dtype, num_clients):
    shapes, updates, weights, blocks = word_round(dtype, num_clients)
    result = aggregate_updates(shapes, updates, weights, blocks, backend=backend)
    assert_matches(result, oracle(shapes, updates, weights, blocks), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_run_words_match_dense_oracle(backend, dtype):
    """Parameters whose every 16-column word sets a run from the word's first column, which the AVX-512 kernel loads
    masked instead of expanding: masks of prefix runs of 0-16 columns a word (the flat tensor's last word partial,
    2100 = 131 x 16 + 4, its run ending at the packed tensor's last value), beside a mask that breaks the pattern
    in one word only (that parameter takes the expand path) and a linear layer's index set over runs of 16."""
    g = torch.Generator().manual_seed(9)
    shapes = {"runs": (2100,), "broken": (2100,), "fc": (4, 70, 16)}
    column = torch.arange(2100)
    updates = []
    for client in range(5):
        full = {name: torch.randn(shape, generator=g, dtype=dtype) for name, shape in shapes.items()}
        lengths = torch.randint(0, 17, (132,), generator=g)
        runs = column % 16 < lengths[column // 16]
        if client == 0:
            runs[-4:] = True  # the partial last word full
        broken = runs.clone()
        if client == 2:
            broken[0], broken[1] = False, True  # word 0 sets column 1 but not 0: not a run
        channels = torch.nonzero(torch.rand(70, generator=g) < 0.6).ravel()
        updates.append({"runs": MaskedUpdate.gather(full["runs"], runs),
                        "broken": MaskedUpdate.gather(full["broken"], broken),
                        "fc": IndexedUpdate.gather(full["fc"], (torch.tensor([0, 2, 3]), channels, None))})
    weights = [1.0 + 0.5 * client for client in range(5)]
    result = aggregate_updates(shapes, updates, weights, {}, backend=backend)
    assert_matches(result, oracle(shapes, updates, weights, {}), dtype)


@needs_ext
def test_sparse_fused_is_deterministic_and_leaves_slices_on_the_old_op(monkeypatch):
    shapes, updates, weights, blocks = random_round(3, 9, torch.float32)
    first = aggregate_updates(shapes, updates, weights, blocks, backend="fused")
    second = aggregate_updates(shapes, updates, weights, blocks, backend="fused")
    for name in shapes:
        assert torch.equal(first.delta[name], second.delta[name])
    assert torch.equal(first.div_num, second.div_num) and torch.equal(first.div_den, second.div_den)
    # A round of slices only never reaches the sparse op.
    import hasfl_ray.ops.sparse as sparse

    def refuse(*args, **kwargs):
        raise AssertionError("slices went through the sparse path")

    monkeypatch.setattr(sparse, "aggregate_sparse", refuse)
    slices_only = [{n: t for n, t in u.items() if isinstance(t, torch.Tensor)} for u in updates]
    slices_only = [u for u in slices_only if u] or [{"bias": torch.zeros(3)}]
    aggregate_updates(shapes, slices_only, [1.0] * len(slices_only), blocks, backend="fused")


@needs_ext
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_coordinate_held_only_as_signed_zeros_averages_to_plus_zero_as_in_the_reference(dtype):
    """Values from {+0, -0, +-1.5} at equal weights (every sum exact, some cancelling to zero), and a parameter every
    client holds at the same coordinates as -0 only: the mean of a coordinate whose sum is zero is +0, never -0, in
    the fused kernel as in the reference (the AVX-512 kernel adds w x +0 for the clear lanes of a word unmasked,
    which is exact only because its sums start at +0)."""
    rng = np.random.default_rng(17)
    shapes = {"flat": (2100,), "rows": (6, 300), "same": (300,)}
    choices = np.array([0.0, -0.0, -0.0, -0.0, 1.5, -1.5])
    same = torch.from_numpy(rng.random(300) < 0.4)
    updates = []
    for client in range(7):
        update = {"same": MaskedUpdate.gather(torch.full((300,), -0.0, dtype=dtype), same)}
        for name, full in list(shapes.items())[:2]:
            dense = torch.from_numpy(rng.choice(choices, size=full)).to(dtype)
            if client % 2 and len(full) == 2:
                rows = torch.from_numpy(np.sort(rng.choice(full[0], 4, replace=False))).long()
                cols = torch.from_numpy(np.sort(rng.choice(full[1], 170, replace=False))).long()
                update[name] = IndexedUpdate.gather(dense, (rows, cols))
            else:
                update[name] = MaskedUpdate.gather(dense, torch.from_numpy(rng.random(full) < 0.4))
        updates.append(update)
    weights = [1.0] * len(updates)
    fused = aggregate_updates(shapes, updates, weights, {}, backend="fused")
    reference = aggregate_updates(shapes, updates, weights, {}, backend="reference")
    for name in shapes:
        zero = fused.delta[name] == 0
        assert zero.any() and not torch.signbit(fused.delta[name][zero]).any()
        assert torch.equal(torch.signbit(fused.delta[name]), torch.signbit(reference.delta[name]))
        torch.testing.assert_close(fused.delta[name], reference.delta[name], rtol=0, atol=0)


@needs_ext
def test_portable_sparse_kernel_matches_oracle():
    """The portable build (no AVX-512), which this machine would otherwise never run."""
    script = (
        "import sys, torch; sys.path.insert(0, sys.argv[1])\n"
        "from test_sparse import random_round, oracle, assert_matches\n"
        "from hasfl_ray.aggregation import aggregate_updates\n"
        "for dtype in (torch.float32, torch.float64):\n"
        "    s, u, w, b = random_round(11, 7, dtype)\n"
        "    assert_matches(aggregate_updates(s, u, w, b, backend='fused'), oracle(s, u, w, b), dtype)\n"
        "print('ok')\n")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, HASFL_PORTABLE_CPU_KERNEL="1")
    done = subprocess.run([sys.executable, "-c", script, here], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


_ROUNDS = (
    "import sys, pickle, torch; sys.path.insert(0, sys.argv[1])\n"
    "from test_sparse import random_round\n"
    "from hasfl_ray.aggregation import aggregate_updates\n"
    "out = []\n"
    "for kinds in (('mask',), ('index', 'mask'), ('index',)):\n"
    "    for dtype in (torch.float32, torch.float64):\n"
    "        for seed in range(3):\n"
    "            s, u, w, b = random_round(seed, 7, dtype, kinds)\n"
    "            s = {k: v for k, v in s.items() if k != 'gates'}  # a slice of every client: the dense kernel\n"
    "            u = [{k: v for k, v in x.items() if k != 'gates'} for x in u]\n"
    "            r = aggregate_updates(s, u, w, {}, backend='fused')\n"
    "            out.append((r.delta, r.div_num, r.div_den))\n"
    "from hasfl_ray.aggregation import IndexedUpdate\n"
    "g = torch.Generator().manual_seed(5)  # every word a run from its first column, bytes partly held too\n"
    "s, u = {'w': (9, 600), 'v': (40, 520)}, []  # rows of >= 512 columns stay rows (no merge)\n"
    "for c in range(7):\n"
    "    if c % 2:  # rows chosen, the last dim whole: words 0xffff and the row's last, 0x00ff\n"
    "        pick = lambda n, k: [torch.sort(torch.randperm(n, generator=g)[:k]).values, None]\n"
    "        u.append({'w': IndexedUpdate.gather(torch.randn(9, 600, generator=g), pick(9, 1 + c)),\n"
    "                  'v': IndexedUpdate.gather(torch.randn(40, 520, generator=g), pick(40, 5 + c))})\n"
    "    else:  # slices 13, 87, 161, 235 and 9, 31, 53, 75 wide: a last word of 8 + 5, 7, 1, 11 or 9 columns\n"
    "        u.append({'w': torch.randn(1 + c, 13 + 37 * c, generator=g), 'v': torch.randn(3 + c, 9 + 11 * c, generator=g)})\n"
    "r = aggregate_updates(s, u, [1.0 + c for c in range(7)], {}, backend='fused')\n"
    "out.append((r.delta, r.div_num, r.div_den))\n"
    "from hasfl_ray.bench.layouts import make_layout_federation\n"
    "f = make_layout_federation('emnist', 6, 'index', seed=1)  # channel sets: fc1's words whole or empty (runs)\n"
    "r = aggregate_updates(f.shapes, f.updates, f.weights, f.gate_blocks, backend='fused')\n"
    "out.append((r.delta, r.div_num, r.div_den))\n"
    "from hasfl_ray.aggregation import MaskedUpdate\n"
    "g = torch.Generator().manual_seed(9)  # clients holding few of a tile's columns (the AVX2 build's push pass 2),\n"
    "s, u = {'m': (3, 5000)}, []  # values of every magnitude, so a value in another norm lane changes the bits\n"
    "for c, density in enumerate((0.9, 0.05, 0.3, 0.02, 0.6, 0.1)):\n"
    "    full = torch.randn(3, 5000, generator=g) * 3.0 ** torch.randint(-2, 3, (3, 5000), generator=g)\n"
    "    u.append({'m': MaskedUpdate.gather(full, torch.rand(3, 5000, generator=g) < density)})\n"
    "r = aggregate_updates(s, u, [1.0 + c for c in range(6)], {}, backend='fused')\n"
    "out.append((r.delta, r.div_num, r.div_den))\n"
    "sys.stdout.buffer.write(pickle.dumps(out))\n")


@needs_ext
@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
                    reason="needs a CPU with AVX2 (the AVX2 build of the sparse kernel)")
def test_the_avx2_sparse_kernel_equals_the_portable_one_bit_for_bit():
    """On a CPU with AVX2 but not AVX-512 (HASFL_NO_AVX512_CPU_KERNEL=1 makes any such CPU one) the sparse kernel
    takes 16 columns at a time with the portable build's multiplies and adds: every delta, sign and norm the same bits
    (index sets, masks and both mixed, float32 and float64, and the EMNIST CNN's channel index sets, whose fc1 words
    are whole or empty: the run-word loads), so no run's params_sha256 moves on such a machine."""
    import pickle

    here = os.path.dirname(os.path.abspath(__file__))
    results = []
    for variable in ("HASFL_NO_AVX512_CPU_KERNEL", "HASFL_PORTABLE_CPU_KERNEL"):
        done = subprocess.run([sys.executable, "-c", _ROUNDS, here], env=dict(os.environ, **{variable: "1"}),
                              capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        results.append(pickle.loads(done.stdout))
    for (delta, num, den), (delta_p, num_p, den_p) in zip(*results):
        for name in delta:
            assert torch.equal(delta[name], delta_p[name]), name
            assert torch.equal(torch.signbit(delta[name]), torch.signbit(delta_p[name])), name
        assert torch.equal(num, num_p) and torch.equal(den, den_p)


def test_bits_round_trip():
    mask = torch.rand(7, 13) < 0.5
    bits = pack_bits(mask)
    assert bits.dtype == torch.uint8 and bits.numel() == (91 + 7) // 8
    assert torch.equal(unpack_bits(bits, (7, 13)), mask)


def test_count_bits_counts_every_byte_of_any_length():
    """8 bytes a step and the rest byte by byte: lengths around the 8-byte boundary, and an unaligned start."""
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, 40, dtype=np.uint8)
    for start in (0, 1):
        for length in range(0, 26):
            array = data[start:start + length]
            assert count_bits(array) == int(np.unpackbits(array).sum())


SHAPES = {"w": (4, 6), "b": (4,)}
DENSE = torch.arange(24.0).reshape(4, 6)


def idx(*values):
    return torch.tensor(values, dtype=torch.int64)


BAD = {
    "index outside the layer": (IndexedUpdate(torch.zeros(2, 6), (idx(1, 4), None)), ValueError,
                                "holds index 4, outside dim 0 of size 4"),
    "negative index": (IndexedUpdate(torch.zeros(2, 6), (idx(-1, 2), None)), ValueError, "holds index -1"),
    "duplicated index": (IndexedUpdate(torch.zeros(2, 6), (idx(1, 1), None)), ValueError, "not strictly increasing"),
    "unsorted index": (IndexedUpdate(torch.zeros(2, 6), (idx(2, 1), None)), ValueError, "not strictly increasing"),
    # the range is checked first, and on an unsorted list not by its ends alone (7 sits in the middle)
    "unsorted index outside the layer": (IndexedUpdate(torch.zeros(3, 6), (idx(2, 7, 1), None)), ValueError,
                                         "holds index 7, outside dim 0 of size 4"),
    "index of floats": (IndexedUpdate(torch.zeros(2, 6), (torch.tensor([1.0, 2.0]), None)), TypeError,
                        "expected a 1-D torch.int64 tensor or None"),
    # torch's "can't convert Sparse layout tensor to numpy" before (h62)
    "sparse index": (IndexedUpdate(torch.zeros(2, 6), (idx(1, 2).to_sparse(), None)), TypeError,
                     "is a torch.sparse_coo tensor; expected a 1-D torch.int64 tensor or None"),
    "index per dim missing": (IndexedUpdate(torch.zeros(2, 6), (idx(1, 2),)), ValueError, "one per dim"),
    "values misfit index": (IndexedUpdate(torch.zeros(3, 6), (idx(1, 2), None)), ValueError,
                            "has 3 entries in dim 0 but its index set there holds 2"),
    "mask of wrong length": (MaskedUpdate(torch.zeros(1), torch.zeros(2, dtype=torch.uint8)), ValueError,
                             "expected a 1-D torch.uint8 bitmask of 3 bytes"),
    "mask of wrong dtype": (MaskedUpdate(torch.zeros(1), torch.zeros(3, dtype=torch.int64)), ValueError,
                            "expected a 1-D torch.uint8 bitmask"),
    "values misfit mask": (MaskedUpdate(torch.zeros(2), torch.tensor([1, 0, 0], dtype=torch.uint8)), ValueError,
                           "its mask holds 1 coordinates"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_sparse_input_is_one_sentence(backend, case):
    packed, error, words = BAD[case]
    with pytest.raises(error) as raised:
        aggregate_updates(SHAPES, [{"w": packed}], [1.0], backend=backend)
    message = str(raised.value)
    assert words in message and "updates[0]['w']" in message and "\n" not in message


def test_mask_of_wrong_shape_or_dtype_is_refused_when_gathered():
    with pytest.raises(ValueError, match=r"mask has shape \(4, 5\) and dtype torch.bool; expected a torch.bool "
                                         r"tensor of the parameter's shape \(4, 6\)"):
        MaskedUpdate.gather(DENSE, torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="dtype torch.float32"):
        MaskedUpdate.gather(DENSE, torch.ones(4, 6))


@needs_ext
def test_op_names_the_entry_whose_bitmask_disagrees():
    # The tile prefixes are counted for all entries in parallel and checked after: the refusal still names the
    # first entry whose bits disagree with its packed size, and a long row (several 1024-column tiles, a partial
    # last one) counts right for the others.
    from hasfl_ray.ops.sparse import build_sparse_layout

    shapes = {"w": (3, 1100)}
    generator = torch.Generator().manual_seed(5)
    updates = [{"w": MaskedUpdate.gather(torch.randn(3, 1100, generator=generator),
                                         torch.rand(3, 1100, generator=generator) < density)}
               for density in (0.9, 0.5, 0.2)]
    layout = build_sparse_layout(shapes, updates, {})
    weights = torch.ones(3, dtype=torch.float64)
    out = torch.empty(layout.total_numel)
    torch.ops.hasfl_ray.aggregate_sparse_into(out, layout.packed, layout.params, layout.entries, weights,
                                              layout.kinds, layout.bits, layout.rows, layout.row_offsets)
    bad_bits = [b.clone() for b in layout.bits]
    bad_bits[1][0] ^= 1  # one bit flipped in entry 1 only
    with pytest.raises(RuntimeError, match=r"bits\[1\] sets \d+ bits of the last dim but entries\[1\] holds"):
        torch.ops.hasfl_ray.aggregate_sparse_into(out, layout.packed, layout.params, layout.entries, weights,
                                                  layout.kinds, bad_bits, layout.rows, layout.row_offsets)


@needs_ext
def test_op_refuses_inconsistent_tables_without_crashing():
    from hasfl_ray.ops.sparse import build_sparse_layout

    update = {"w": MaskedUpdate.gather(DENSE, DENSE > 10)}
    layout = build_sparse_layout(SHAPES, [update], {})
    bad_bits = [torch.zeros_like(b) for b in layout.bits]  # popcount no longer matches the values
    out = torch.empty(layout.total_numel)
    with pytest.raises(RuntimeError, match="sets 0 bits"):
        torch.ops.hasfl_ray.aggregate_sparse_into(out, layout.packed, layout.params, layout.entries,
                                                  torch.ones(1, dtype=torch.float64), layout.kinds, bad_bits,
                                                  layout.rows, layout.row_offsets)
