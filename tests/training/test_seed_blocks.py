"""The asynchronous loop's block-derived dispatch streams (hasfl_ray/training/seed_blocks.py) against numpy's scalar
derivation (``stream_seed``, ``numpy_rng``, ``Generator.integers`` and ``Generator.random``), on many random keys."""

import numpy as np
import pytest

from hasfl_ray.training.seed_blocks import (BLOCK, MASK32, DispatchStreams, Pcg64, int_words, pcg64_states,
                                            stream_seeds)
from hasfl_ray.training.seeding import numpy_rng, stream_seed


def random_words(generator, count):
    """Non-negative integers of 1 to 3 uint32 words (0 and word boundaries included)."""
    edges = [0, 1, MASK32, MASK32 + 1, 2 ** 63 - 1, 2 ** 64 - 1, 2 ** 64]
    values = [int(generator.integers(0, 2 ** 63)) >> int(generator.integers(0, 63)) for _ in range(count)]
    return edges + values + [v << 64 for v in values[:5]]


def test_int_words_are_seed_sequences_entropy():
    for value, words in ((0, [0]), (5, [5]), (MASK32, [MASK32]), (MASK32 + 1, [0, 1]), (2 ** 64 + 7, [7, 0, 1])):
        assert int_words(value) == words
        assert np.random.SeedSequence(value).entropy == value  # (numpy keeps the int; its words are the above)
    with pytest.raises(ValueError, match="non-negative"):
        int_words(-1)


def test_stream_seeds_are_stream_seed_of_each_key():
    generator = np.random.default_rng(46)
    for prefix_word in random_words(generator, 30):
        kind = int(generator.integers(0, 40))
        numbers = np.concatenate([[0, 1, MASK32], generator.integers(0, MASK32 + 1, size=37)])
        seeds = stream_seeds((prefix_word, 22), numbers, (kind,))
        assert seeds.dtype == np.uint64
        assert seeds.tolist() == [stream_seed(prefix_word, 22, int(n), kind) for n in numbers]
    # other shapes of key: no prefix, no suffix, a longer one
    numbers = generator.integers(0, 10 ** 6, size=20)
    assert stream_seeds((), numbers).tolist() == [stream_seed(int(n)) for n in numbers]
    assert stream_seeds((3, 2 ** 70, 9, 1), numbers, (4, 2 ** 40)).tolist() == \
        [stream_seed(3, 2 ** 70, 9, 1, int(n), 4, 2 ** 40) for n in numbers]
    with pytest.raises(ValueError, match="2\\*\\*32"):
        stream_seeds((1,), [MASK32 + 1])


def test_pcg64_states_are_default_rngs():
    generator = np.random.default_rng(7)
    seeds = [0, 1, MASK32, MASK32 + 1, 2 ** 63 - 1, 2 ** 64 - 1] + \
        [int(generator.integers(0, 2 ** 63)) >> int(generator.integers(0, 63)) for _ in range(300)]
    states = pcg64_states(np.array(seeds, dtype=np.uint64))
    for seed, (state, inc) in zip(seeds, states):
        assert np.random.default_rng(seed).bit_generator.state["state"] == {"state": state, "inc": inc}


def test_pcg64_draws_are_the_generators():
    generator = np.random.default_rng(11)
    for _ in range(200):
        seed = int(generator.integers(0, 2 ** 63))
        reference = np.random.default_rng(seed).bit_generator.state["state"]
        high = int(generator.choice([2, 3, 10, 10_000, 100_000, 2 ** 31 + 1, 3 * 10 ** 9, MASK32]))
        size = int(generator.integers(1, 60))
        assert Pcg64(reference["state"], reference["inc"]).integers(high, size) == \
            np.random.default_rng(seed).integers(0, high, size=size).tolist()
        # drawn in pieces: the same numbers (numpy keeps the odd 32-bit half across calls, and so does Pcg64)
        rng, pieces = Pcg64(reference["state"], reference["inc"]), []
        for piece in (1, 3, 4, size):
            pieces += rng.integers(high, piece)
        assert pieces == np.random.default_rng(seed).integers(0, high, size=8 + size).tolist()
        assert Pcg64(reference["state"], reference["inc"]).random(size) == \
            np.random.default_rng(seed).random(size).tolist()
    with pytest.raises(ValueError, match="high"):
        Pcg64(1, 1).integers(1, 3)


@pytest.mark.parametrize("seed", [0, 3, 2 ** 40 + 17])
def test_dispatch_streams_are_numpy_rng_of_each_dispatch(seed):
    generator = np.random.default_rng(seed % 1000)
    streams = DispatchStreams((seed, 22), (2,))
    numbers = list(range(2 * BLOCK + 5)) + [int(n) for n in generator.integers(0, MASK32 + 1, size=40)] + \
        [MASK32, MASK32 + 1, 2 ** 40] + list(range(BLOCK - 3, BLOCK + 3))  # back to an evicted block
    for n in numbers:
        expected = numpy_rng(seed, 22, n, 2)
        assert streams(n).integers(10_000, 16) == expected.integers(0, 10_000, size=16).tolist()
        assert DispatchStreams((seed, 22), (3,))(n).random(2) == numpy_rng(seed, 22, n, 3).random(2).tolist()
    assert len(streams.blocks) <= 2
