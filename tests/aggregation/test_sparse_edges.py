"""The fused aggregation's sparse path (index sets and masks) at its edges (h67): NaN, infinities, -0.0 and
subnormals in the packed values, masks holding nothing or everything, one holder, one client, more holders than a
tile's worth, last dims around the tile and vector widths, scalars, parameters of no coordinates, empty index lists,
float64, weights of 1e-300, 1e300 and 1e16 apart; packed tensors and bitmasks ending at an inaccessible page. Each
build of the CPU kernel (this CPU's, the portable one under HASFL_PORTABLE_CPU_KERNEL=1) gives the same bits, and
the float64 pure-torch reference's values within float tolerance."""

import os
import pickle
import subprocess
import sys

import pytest
import torch

from aggregation_cases import stdout_in_each_build
from hasfl_ray.aggregation import IndexedUpdate, MaskedUpdate, aggregate_updates
from hasfl_ray.aggregation.packed import pack_bits
from hasfl_ray.ops import aggregate as ops

needs_ext = pytest.mark.skipif(not (ops.available() and hasattr(torch.ops.hasfl_ray, "aggregate_sparse_into")),
                               reason="needs hasfl_ray._C built with aggregate_sparse_into")
HERE = os.path.dirname(os.path.abspath(__file__))
NAN, INF = float("nan"), float("inf")
SPECIALS = [NAN, -NAN, INF, -INF, -0.0, 0.0, 1e-45, -1e-45, 1e-40, 1e-310, 3e38, -3e38, 1.0, -1.0]


def _mask(full, mask, dtype):
    return MaskedUpdate(full[mask].to(dtype).contiguous(), pack_bits(mask))


def edge_rounds():
    """[(label, shapes, updates, weights)]: deterministic (one generator), so that every process builds the same.
    Every parameter has an index-set or mask holder (the sparse kernel; a parameter every client holds as a slice
    takes the dense kernel, whose AVX2 build fuses multiply-adds and differs from the portable one in the last bits)."""
    g = torch.Generator().manual_seed(67)
    rounds = []
    for dtype in (torch.float32, torch.float64):
        specials = torch.tensor(SPECIALS, dtype=torch.float64).to(dtype)
        for cols in (1, 15, 16, 17, 1023, 1024, 1025, 4097):
            shape = (3, cols)

            def special_full():
                return specials[torch.randint(0, len(specials), (3 * cols,), generator=g)].reshape(shape)
            updates = [{"w": _mask(special_full(), torch.rand(shape, generator=g) < 0.6, dtype)} for _ in range(3)]
            picked = torch.randperm(cols, generator=g)[:max(1, cols // 2)].sort().values
            updates.append({"w": IndexedUpdate.gather(special_full(), (torch.tensor([0, 2]), picked))})
            rounds.append((f"specials {dtype} {cols}", {"w": shape}, updates, [1.0, 2.0, 3.0, 0.5]))
            full = torch.randn(shape, generator=g, dtype=dtype)
            nothing, everything = torch.zeros(shape, dtype=torch.bool), torch.ones(shape, dtype=torch.bool)
            updates = [{"w": _mask(full, nothing, dtype),
                        "b": _mask(torch.randn(3, generator=g, dtype=dtype), torch.ones(3, dtype=torch.bool), dtype)},
                       {"w": _mask(full * 2, everything, dtype),
                        "one": IndexedUpdate.gather(torch.randn(4, cols, generator=g, dtype=dtype),
                                                    (torch.tensor([1, 3]), None))},
                       {"w": _mask(full * 3, nothing, dtype)}]
            rounds.append((f"nothing/everything/one holder {dtype} {cols}",
                           {"w": shape, "b": (3,), "one": (4, cols)}, updates, [1.0, 1.0, 7.0]))
            rounds.append((f"one client {dtype} {cols}", {"w": shape},
                           [{"w": _mask(full, torch.rand(shape, generator=g) < 0.3, dtype)}], [2.5]))
        for clients in (61, 130):
            updates = []
            for c in range(clients):
                full = torch.randn(5, 37, generator=g, dtype=dtype)
                updates.append({"p": [_mask(full, torch.rand(5, 37, generator=g) < 0.5, dtype),
                                      IndexedUpdate.gather(full, (torch.tensor([c % 5]), None)),
                                      full[:2, :20].contiguous()][c % 3],
                                "q": IndexedUpdate.gather(torch.randn(3, 1100, generator=g, dtype=dtype),
                                                          (torch.tensor([0, 2]), torch.arange(c % 3, 1100, 3)))})
            weights = (torch.rand(clients, generator=g, dtype=torch.float64) * 10 + 0.1).tolist()
            rounds.append((f"{clients} holders {dtype}", {"p": (5, 37), "q": (3, 1100)}, updates, weights))
        empty = torch.zeros(0, dtype=torch.int64)
        rounds.append((f"scalars {dtype}", {"s": ()},
                       [{"s": MaskedUpdate(torch.tensor([2.0], dtype=dtype), torch.tensor([1], dtype=torch.uint8))},
                        {"s": MaskedUpdate(torch.zeros(0, dtype=dtype), torch.tensor([0], dtype=torch.uint8))},
                        {"s": IndexedUpdate(torch.tensor(5.0, dtype=dtype), ())}, {"s": torch.tensor(3.0, dtype=dtype)}],
                       [1.0, 2.0, 3.0, 4.0]))
        rounds.append((f"empty lists, no coordinates {dtype}", {"z": (4, 3), "w": (2, 4), "e": (0, 5)},
                       [{"z": IndexedUpdate(torch.zeros(0, 3, dtype=dtype), (empty, None)),
                         "w": IndexedUpdate(torch.zeros(2, 0, dtype=dtype), (None, empty)),
                         "e": IndexedUpdate(torch.zeros(0, 5, dtype=dtype), (None, None))},
                        {"z": IndexedUpdate(torch.ones(2, 3, dtype=dtype), (torch.tensor([0, 1]), None)),
                         "w": torch.ones(2, 4, dtype=dtype),
                         "e": MaskedUpdate(torch.zeros(0, dtype=dtype), torch.zeros(0, dtype=torch.uint8))}],
                       [1.0, 2.0]))
        full = torch.randn(6, 5, 3, 3, generator=g, dtype=dtype)
        rounds.append((f"conv index sets {dtype}", {"c": (6, 5, 3, 3)},
                       [{"c": IndexedUpdate.gather(full, (torch.tensor([0, 5]), torch.tensor([1, 2, 4]), None, None))},
                        {"c": IndexedUpdate.gather(full * 2, (None, torch.tensor([2]), torch.tensor([0, 2]),
                                                              torch.tensor([1])))},
                        {"c": full[:3, :2].contiguous()}], [1.0, 2.0, 3.0]))
        for weights in ([1e-300] * 3, [1e300] * 3, [1.0, 1e16, 1e-16], [1e300, 1e-300, 1.0]):
            shape = (4, 40)
            rounds.append((f"weights {weights} {dtype}", {"w": shape},
                           [{"w": _mask(torch.randn(shape, generator=g, dtype=dtype), torch.rand(shape, generator=g) < 0.5,
                                        dtype)},
                            {"w": IndexedUpdate.gather(torch.randn(shape, generator=g, dtype=dtype),
                                                       (torch.tensor([1, 3]), None))},
                            {"w": torch.randn(2, 30, generator=g, dtype=dtype)}], weights))
    return rounds


_RUN = ("import sys, pickle; sys.path.insert(0, sys.argv[1])\n"
        "from test_sparse_edges import edge_rounds\n"
        "from hasfl_ray.aggregation import aggregate_updates\n"
        "out = []\n"
        "for label, shapes, updates, weights in edge_rounds():\n"
        "    r = aggregate_updates(shapes, updates, weights, backend='fused')\n"
        "    out.append((label, r.delta, r.div_num, r.div_den))\n"
        "sys.stdout.buffer.write(pickle.dumps(out))\n")


def _fused_in_a_process(portable: bool):
    env = {k: v for k, v in os.environ.items() if k != "HASFL_PORTABLE_CPU_KERNEL"}
    if portable:
        env["HASFL_PORTABLE_CPU_KERNEL"] = "1"
    done = subprocess.run([sys.executable, "-c", _RUN, HERE], env=env, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return pickle.loads(done.stdout)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32 if t.element_size() == 4 else torch.int64)


@needs_ext
def test_every_cpu_build_gives_the_same_bits_at_the_edges():
    """This CPU's build (AVX2 pull path on a Zen 3) against the portable one, every bit of every delta (the sign of
    zero and of NaN included) and both norms. -NaN + NaN is the first operand's NaN and compilers order an add's
    operands as they like: the AVX2 build gave -NaN (0xffc00000) where the portable one gave NaN (0x7fc00000)."""
    fast, portable = _fused_in_a_process(False), _fused_in_a_process(True)
    for (label, delta, num, den), (_, delta_p, num_p, den_p) in zip(fast, portable):
        for name in delta:
            assert torch.equal(_bits(delta[name]), _bits(delta_p[name])), (label, name)
        assert torch.equal(_bits(num), _bits(num_p)) and torch.equal(_bits(den), _bits(den_p)), label


@needs_ext
def test_nans_of_both_signs_on_one_coordinate_give_the_canonical_nan_in_every_build():
    """The smallest reproducer: two clients' masks hold the one coordinate as -NaN and NaN."""
    script = ("import torch\n"
              "from hasfl_ray.aggregation import MaskedUpdate, aggregate_updates\n"
              "bits = torch.tensor([1], dtype=torch.uint8)\n"
              "u = [{'w': MaskedUpdate(torch.tensor([-float('nan')]), bits)},\n"
              "     {'w': MaskedUpdate(torch.tensor([float('nan')]), bits)}]\n"
              "r = aggregate_updates({'w': (1,)}, u, [1.0, 1.0], backend='fused')\n"
              "print(r.delta['w'].view(torch.int32).item() & 0xffffffff, r.div_num.view(torch.int64).tolist())\n")
    seen = stdout_in_each_build(script)
    nan64 = torch.tensor([NAN], dtype=torch.float64).view(torch.int64).item()
    assert seen == {f"{0x7fc00000} {[nan64, nan64]}"}


def _finite_max(packed) -> float:
    values = (packed if isinstance(packed, torch.Tensor) else packed.values).double().abs()
    return values.nan_to_num(posinf=0.0, neginf=0.0).max().item() if values.numel() else 0.0


@needs_ext
@pytest.mark.parametrize("round_", edge_rounds(), ids=lambda r: r[0])
def test_the_fused_kernel_matches_the_reference_at_the_edges(round_):
    """Within float tolerance of the float64 reference, NaN where it has NaN. Weights 1e300 and values 3e38 cancel
    in float64 to within ~1e22 of each other (the reference normalises the weights first), so the tolerance is taken
    relative to the largest weighted value a coordinate sums."""
    label, shapes, updates, weights = round_
    fused = aggregate_updates(shapes, updates, weights, backend="fused")
    reference = aggregate_updates(shapes, updates, weights, backend="reference")
    for name in shapes:
        got, want = fused.delta[name].double(), reference.delta[name].double()
        assert torch.equal(got.isnan(), want.isnan()), (label, name)
        finite = ~want.isnan()
        scale = max([_finite_max(u[name]) for u in updates if name in u], default=0.0)
        torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=1e-12 + 1e-15 * scale,
                                   msg=lambda m: f"{label} {name}: {m}")
    torch.testing.assert_close(fused.div_num, reference.div_num, rtol=1e-5, atol=1e-9, equal_nan=True)
    torch.testing.assert_close(fused.div_den, reference.div_den, rtol=1e-5, atol=1e-9, equal_nan=True)


_GUARDED = '''
import ctypes, mmap, sys, torch
from hasfl_ray.aggregation import MaskedUpdate, IndexedUpdate, aggregate_updates
from hasfl_ray.aggregation.packed import pack_bits
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
kept = []
def guarded(src):
    """A copy of 1-D src whose last byte lies just before a page that may not be read (PROT_NONE)."""
    page, nbytes = mmap.PAGESIZE, src.numel() * src.element_size()
    pages = nbytes // page + 1
    area = mmap.mmap(-1, (pages + 1) * page)
    assert libc.mprotect(ctypes.addressof(ctypes.c_char.from_buffer(area)) + pages * page, page, 0) == 0
    kept.append(area)
    copy = torch.frombuffer(area, dtype=src.dtype, count=src.numel(), offset=pages * page - nbytes)
    copy.copy_(src)
    return copy
g = torch.Generator().manual_seed(5)
for dtype in (torch.float32, torch.float64):
    for cols in (1, 5, 8, 9, 15, 16, 17, 31, 33, 65, 1025):
        for tail in range(1, 8):
            numel = 3 * cols
            mask = torch.rand(numel, generator=g) < 0.4
            mask[max(0, numel - 20):] = False
            mask[numel - min(tail, numel):] = True
            full = torch.randn(numel, generator=g, dtype=dtype)
            other = MaskedUpdate.gather(full * 2, torch.rand(numel, generator=g) < 0.5)
            rounds = [({"w": (numel,)}, [{"w": MaskedUpdate(guarded(full[mask]), guarded(pack_bits(mask)))},
                                         {"w": other}])]
            picked = torch.arange(max(0, cols - tail), cols)
            held = guarded(full.reshape(3, cols)[2:, picked].reshape(-1)).reshape(1, len(picked))
            rounds.append(({"w": (3, cols)}, [{"w": IndexedUpdate(held, (torch.tensor([2]), picked))},
                                              {"w": full.reshape(3, cols)[:1, :1].contiguous()}]))
            for shapes, updates in rounds:
                fused = aggregate_updates(shapes, updates, [1.0, 2.0], backend="fused")
                reference = aggregate_updates(shapes, updates, [1.0, 2.0], backend="reference")
                torch.testing.assert_close(fused.delta["w"], reference.delta["w"])
print("ok")
'''


@needs_ext
@pytest.mark.parametrize("portable", [False, True], ids=["this CPU's build", "portable build"])
def test_packed_tensors_and_bitmasks_ending_at_an_unreadable_page(portable):
    """The AVX2 build reads 8 values at a time where 8 lie before an entry's end and masked loads otherwise: a mask
    whose last set bits are among the last 1-7 coordinates, its values and its bitmask each ending at a PROT_NONE
    page, is read without a fault (a read past either end is SIGSEGV, exit -11) and matches the reference."""
    if sys.platform != "linux":
        pytest.skip("needs Linux (mprotect through ctypes)")
    env = {k: v for k, v in os.environ.items() if k != "HASFL_PORTABLE_CPU_KERNEL"}
    if portable:
        env["HASFL_PORTABLE_CPU_KERNEL"] = "1"
    done = subprocess.run([sys.executable, "-c", _GUARDED], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])


@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_an_index_list_on_meta_is_one_sentence(backend):
    """An index list on the meta device (no values) raised torch's "Cannot copy out of meta tensor; no data!"."""
    update = IndexedUpdate(torch.zeros(2, 6), (torch.tensor([0, 1]).to("meta"), None))
    with pytest.raises(ValueError) as raised:
        aggregate_updates({"w": (4, 6)}, [{"w": update}], [1.0], backend=backend)
    assert str(raised.value) == ("updates[0]['w'].index[0] is on meta, a tensor without values; expected a 1-D "
                                 "torch.int64 tensor with values or None")
    with pytest.raises(ValueError, match=r"^index\[0\] is on meta"):
        IndexedUpdate.gather(torch.zeros(4, 6), (torch.tensor([0, 1]).to("meta"), None))


@pytest.mark.parametrize("backend", ["fused", "reference"])
@pytest.mark.parametrize("kind", ["mask", "index"])
def test_values_in_a_sparse_layout_are_named_as_such(backend, kind):
    """A torch.sparse_coo values tensor was said to be "not contiguous", which it cannot be made by .contiguous()."""
    mask = torch.rand(4, 6, generator=torch.Generator().manual_seed(2)) < 0.5
    update = (MaskedUpdate(torch.ones(int(mask.sum())).to_sparse(), pack_bits(mask)) if kind == "mask" else
              IndexedUpdate(torch.ones(2, 6).to_sparse(), (torch.tensor([0, 1]), None)))
    with pytest.raises(ValueError) as raised:
        aggregate_updates({"w": (4, 6)}, [{"w": update}], [1.0], backend=backend)
    assert str(raised.value) == ("updates[0]['w'].values is a torch.sparse_coo tensor; expected a dense (strided, "
                                 "values.to_dense()) contiguous packed tensor")
