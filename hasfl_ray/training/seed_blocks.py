"""The asynchronous loop's per-dispatch random streams, derived for a block of dispatch numbers at once.

A dispatch ``n`` of an asynchronous run draws from ``numpy_rng(seed, STREAM_CLOCK, n, kind)``
(:mod:`hasfl_ray.training.seeding`): two SeedSequence hashes (the key's, then ``default_rng``'s of the 63-bit seed)
and a PCG64 generator, ~70 µs a dispatch in numpy's scalar code. Here the same numbers come out of

- :func:`stream_seeds`: SeedSequence's hash (uint32 arithmetic) on numpy arrays, one column per word of the key,
  for many keys that differ in one word (the dispatch number) at once: ``stream_seed(*key)`` of each;
- :func:`pcg64_states`: the PCG64 state (state, inc) that ``np.random.default_rng(seed)`` starts from, the
  seeding hash vectorised the same way, the two 128-bit steps in Python integers;
- :class:`Pcg64`: PCG64 (XSL-RR) in Python integers from such a state, with numpy's 32-bit buffering, bounded
  integers (Lemire's method: ``Generator.integers(0, high)``) and doubles (``Generator.random()``);
- :class:`DispatchStreams`: the state of ``numpy_rng(seed, stream, n, kind)`` for any ``n``, from blocks of
  :data:`BLOCK` dispatch numbers.

The same bits as numpy's scalar path: tests/training/test_seed_blocks.py compares every function with numpy's
on many random keys.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

MASK32, MASK64, MASK128 = (1 << 32) - 1, (1 << 64) - 1, (1 << 128) - 1
# SeedSequence's constants (numpy/random/bit_generator.pyx)
INIT_A, MULT_A, INIT_B, MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
MIX_MULT_L, MIX_MULT_R, POOL_SIZE = 0xCA01F9DD, 0x4973F715, 4
SHIFT = np.uint32(16)
# PCG64's multiplier (numpy/random/src/pcg64/pcg64.h: PCG_DEFAULT_MULTIPLIER_128)
PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645
#: Dispatch numbers derived at once.
BLOCK = 256


def int_words(value: int) -> List[int]:
    """SeedSequence's uint32 words of a non-negative integer (least significant first; 0 is one word)."""
    if value < 0:
        raise ValueError(f"a seed word must be non-negative, not {value}")
    words = [value & MASK32]
    value >>= 32
    while value:
        words.append(value & MASK32)
        value >>= 32
    return words


def _pool(entropy: np.ndarray) -> List[np.ndarray]:
    """SeedSequence's mixed pool (4 uint32 columns) of each row of ``entropy`` (rows of uint32 words)."""
    hash_const = INIT_A

    def hashmix(values: np.ndarray) -> np.ndarray:
        nonlocal hash_const
        values = values ^ np.uint32(hash_const)
        hash_const = (hash_const * MULT_A) & MASK32
        values = values * np.uint32(hash_const)
        return values ^ (values >> SHIFT)

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        result = np.uint32(MIX_MULT_L) * x - np.uint32(MIX_MULT_R) * y
        return result ^ (result >> SHIFT)

    rows, length = entropy.shape
    zero = np.zeros(rows, dtype=np.uint32)
    mixer = [hashmix(entropy[:, i] if i < length else zero) for i in range(POOL_SIZE)]
    for source in range(POOL_SIZE):
        for target in range(POOL_SIZE):
            if source != target:
                mixer[target] = mix(mixer[target], hashmix(mixer[source]))
    for source in range(POOL_SIZE, length):
        for target in range(POOL_SIZE):
            mixer[target] = mix(mixer[target], hashmix(entropy[:, source]))
    return mixer


def _generate64(pool: List[np.ndarray], count: int) -> List[np.ndarray]:
    """``SeedSequence.generate_state(count, np.uint64)`` of each row: ``count`` uint64 columns."""
    hash_const, words = INIT_B, []
    for i in range(2 * count):
        value = pool[i % POOL_SIZE] ^ np.uint32(hash_const)
        hash_const = (hash_const * MULT_B) & MASK32
        value = value * np.uint32(hash_const)
        words.append((value ^ (value >> SHIFT)).astype(np.uint64))
    return [words[2 * k] | (words[2 * k + 1] << np.uint64(32)) for k in range(count)]


def stream_seeds(prefix: Sequence[int], numbers: np.ndarray, suffix: Sequence[int] = ()) -> np.ndarray:
    """``stream_seed(*prefix, n, *suffix)`` of every ``n`` of ``numbers`` (each in [0, 2**32)), as uint64."""
    numbers = np.asarray(numbers, dtype=np.int64)
    if numbers.size and (numbers.min() < 0 or numbers.max() > MASK32):
        raise ValueError("stream_seeds takes numbers in [0, 2**32)")
    head = [w for k in prefix for w in int_words(int(k))]
    tail = [w for k in suffix for w in int_words(int(k))]
    entropy = np.empty((len(numbers), len(head) + 1 + len(tail)), dtype=np.uint32)
    entropy[:, :len(head)] = head
    entropy[:, len(head)] = numbers
    entropy[:, len(head) + 1:] = tail
    return _generate64(_pool(entropy), 1)[0] >> np.uint64(1)


def pcg64_states(seeds: np.ndarray) -> List[Tuple[int, int]]:
    """(state, inc) of ``np.random.default_rng(seed).bit_generator`` for every seed (non-negative, < 2**64)."""
    seeds = np.asarray(seeds, dtype=np.uint64)
    out: List[Tuple[int, int]] = [(0, 0)] * len(seeds)
    wide = seeds > np.uint64(MASK32)
    for rows in (np.flatnonzero(~wide), np.flatnonzero(wide)):
        if not len(rows):
            continue
        low = (seeds[rows] & np.uint64(MASK32)).astype(np.uint32)
        columns = [low] if not wide[rows[0]] else [low, (seeds[rows] >> np.uint64(32)).astype(np.uint32)]
        values = [column.tolist() for column in _generate64(_pool(np.stack(columns, axis=1)), 4)]
        for k, row in enumerate(rows.tolist()):
            initstate = (values[0][k] << 64) | values[1][k]
            inc = (((values[2][k] << 64) | values[3][k]) << 1 | 1) & MASK128
            state = (inc + initstate) & MASK128  # state 0 stepped once, plus initstate
            out[row] = ((state * PCG_MULT + inc) & MASK128, inc)
    return out


class Pcg64:
    """numpy's PCG64 from (state, inc), in Python integers: the draws its Generator makes, bit for bit."""

    __slots__ = ("state", "inc", "has32", "word32")

    def __init__(self, state: int, inc: int):
        self.state, self.inc, self.has32, self.word32 = state, inc, False, 0

    def next64(self) -> int:
        state = self.state = (self.state * PCG_MULT + self.inc) & MASK128
        high, value = state >> 64, (state >> 64) ^ (state & MASK64)
        rotation = high >> 58
        return ((value >> rotation) | (value << (64 - rotation))) & MASK64

    def next32(self) -> int:
        if self.has32:
            self.has32 = False
            return self.word32
        value = self.next64()
        self.has32, self.word32 = True, value >> 32
        return value & MASK32

    def integers(self, high: int, size: int) -> List[int]:
        """``Generator.integers(0, high, size=size).tolist()`` for 2 <= high <= 2**32 - 1 (Lemire's method)."""
        if not 2 <= high <= MASK32:
            raise ValueError(f"Pcg64.integers takes 2 <= high < 2**32, not {high}")
        threshold = (MASK32 - (high - 1)) % high
        out = []
        for _ in range(size):
            m = self.next32() * high
            if (m & MASK32) < high:
                while (m & MASK32) < threshold:
                    m = self.next32() * high
            out.append(m >> 32)
        return out

    def random(self, size: int) -> List[float]:
        """``Generator.random(size).tolist()``."""
        return [(self.next64() >> 11) * (1.0 / 9007199254740992.0) for _ in range(size)]


class DispatchStreams:
    """The generators ``numpy_rng(*prefix, n, *suffix)`` of dispatch numbers ``n``, as :class:`Pcg64`, derived
    :data:`BLOCK` numbers at a time (the block holding ``n``; the last two blocks are kept)."""

    def __init__(self, prefix: Sequence[int], suffix: Sequence[int] = ()):
        self.prefix, self.suffix = tuple(int(k) for k in prefix), tuple(int(k) for k in suffix)
        self.blocks: Dict[int, List[Tuple[int, int]]] = {}

    def __call__(self, n: int) -> Pcg64:
        if not 0 <= n <= MASK32:  # (beyond a block's one word: numpy's own derivation)
            from hasfl_ray.training.seeding import numpy_rng

            state = numpy_rng(*self.prefix, n, *self.suffix).bit_generator.state["state"]
            return Pcg64(state["state"], state["inc"])
        block, offset = divmod(n, BLOCK)
        states = self.blocks.get(block)
        if states is None:
            first = block * BLOCK
            numbers = np.arange(first, min(first + BLOCK, MASK32 + 1), dtype=np.int64)
            states = pcg64_states(stream_seeds(self.prefix, numbers, self.suffix))
            if len(self.blocks) >= 2:
                self.blocks.pop(min(self.blocks))
            self.blocks[block] = states
        return Pcg64(*states[offset])


__all__ = ["BLOCK", "DispatchStreams", "Pcg64", "int_words", "pcg64_states", "stream_seeds"]
