"""Dirichlet label partitions and capacity tiers of the paper's protocol."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hasfl_ray.data import TIER_PROBABILITIES, TIERS, assign_tiers, dirichlet_partition, load_dataset
from hasfl_ray.errors import ConfigError


def labels_of(num_classes=10, per_class=200):
    return np.repeat(np.arange(num_classes), per_class)


def test_partition_covers_every_sample_once_and_respects_min_size():
    labels = labels_of()
    parts = dirichlet_partition(labels, 20, 0.3, np.random.default_rng(42), min_size=10)
    assert len(parts) == 20
    assert min(len(p) for p in parts) >= 10
    joined = np.concatenate(parts)
    assert sorted(joined.tolist()) == list(range(len(labels)))
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)


def test_partition_is_a_function_of_the_seed():
    labels = labels_of()
    a = dirichlet_partition(labels, 20, 0.3, np.random.default_rng(42))
    b = dirichlet_partition(labels, 20, 0.3, np.random.default_rng(42))
    c = dirichlet_partition(labels, 20, 0.3, np.random.default_rng(43))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def tv_of(parts, labels, num_classes=10):
    hist = np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts]).astype(float)
    client = hist / hist.sum(axis=1, keepdims=True)
    overall = hist.sum(axis=0) / hist.sum()
    return 0.5 * np.abs(client - overall).sum(axis=1)


def test_smaller_alpha_gives_more_label_skew():
    labels = labels_of()
    skewed = tv_of(dirichlet_partition(labels, 20, 0.3, np.random.default_rng(0)), labels).mean()
    mild = tv_of(dirichlet_partition(labels, 20, 100.0, np.random.default_rng(0)), labels).mean()
    assert skewed > 0.4 and mild < 0.15


def test_impossible_partition_names_the_flags():
    with pytest.raises(ConfigError, match="expected a larger --alpha, fewer --clients, or --partition "
                                          "balanced-dirichlet"):
        dirichlet_partition(labels_of(2, 10), 10, 0.01, np.random.default_rng(0), min_size=2, max_tries=5)
    with pytest.raises(ConfigError, match="pass fewer --clients"):
        dirichlet_partition(labels_of(2, 2), 10, 1.0, np.random.default_rng(0))


def test_twenty_clients_get_8_5_4_3_tiers_with_mean_0525():
    for seed in range(5):
        p_max = assign_tiers(20, np.random.default_rng(seed))
        assert [int((p_max == tier).sum()) for tier in TIERS] == [8, 5, 4, 3]
        assert p_max.mean() == pytest.approx(0.525)
    assert not np.array_equal(assign_tiers(20, np.random.default_rng(0)), assign_tiers(20, np.random.default_rng(1)))


def test_largest_remainder_breaks_ties_in_tier_order():
    # 10 clients: exact shares 4, 2.5, 2, 1.5; the two half remainders go to the lower tiers first.
    p_max = assign_tiers(10, np.random.default_rng(0))
    assert [int((p_max == tier).sum()) for tier in TIERS] == [4, 3, 2, 1]


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=1, max_value=500), st.integers(min_value=0, max_value=2**32 - 1))
def test_tier_counts_are_within_one_of_their_exact_share(num_clients, seed):
    p_max = assign_tiers(num_clients, np.random.default_rng(seed))
    counts = np.array([(p_max == tier).sum() for tier in TIERS])
    assert counts.sum() == num_clients
    assert np.all(np.abs(counts - np.asarray(TIER_PROBABILITIES) * num_clients) < 1)


def test_unknown_dataset_is_a_config_error():
    with pytest.raises(ConfigError, match="dataset is 'imagenet'; expected one of digits"):
        load_dataset("imagenet", 20, 0.3, 42)


def test_tier_counts_option_gives_the_papers_realised_mix_with_the_same_draw():
    from hasfl_ray.data.partition import PAPER_RUNS_TIER_COUNTS, tier_counts
    from hasfl_ray.engine.engine import capacity_tiers

    default = capacity_tiers(42, 20)
    assert tier_counts(20).tolist() == [8, 5, 4, 3] and default.mean() == pytest.approx(0.525)
    np.testing.assert_array_equal(capacity_tiers(42, 20, [8, 5, 4, 3]), default)  # explicit default: same draw
    paper = capacity_tiers(42, 20, PAPER_RUNS_TIER_COUNTS)
    assert [int((paper == t).sum()) for t in (0.25, 0.5, 0.75, 1.0)] == [4, 10, 3, 3]
    assert paper.mean() == pytest.approx(0.5625)


@pytest.mark.parametrize("counts", [[4, 10, 3], [4, 10, 3, 4], [-1, 15, 3, 3], [4.0, 10, 3, 3], "4,10,3,3"])
def test_bad_tier_counts_are_one_sentence(counts):
    from hasfl_ray.config import RunConfig
    from hasfl_ray.errors import ConfigError

    with pytest.raises(ConfigError, match="tier_counts is .*expected 4 non-negative client counts"):
        RunConfig(backend="local", tier_counts=counts)


def test_a_partition_that_needs_the_even_share_names_what_can_work():
    """digits' 1,438 training samples over 200 clients: every client must hold the even share, 7, which a Dirichlet
    draw gives at no alpha (refused at 0.3 and at 1000 alike); the sentence named a larger --alpha, which cannot
    help. It now names fewer clients or the equal-size schemes, and balanced-dirichlet does draw it."""
    from hasfl_ray.data import load_dataset
    from hasfl_ray.data.partition import balanced_dirichlet_partition

    labels = load_dataset("digits", 20, 0.3, 42, partition="iid").train_y.numpy()
    for alpha in (0.3, 1000.0):
        with pytest.raises(ConfigError, match="over 200 clients gave none each its even share of the 1438 samples "
                                              "\\(7\\) in 50 draws, nor would any alpha; expected fewer --clients, "
                                              "or --partition balanced-dirichlet or iid"):
            dirichlet_partition(labels, 200, alpha, np.random.default_rng(42), max_tries=50)
    parts = balanced_dirichlet_partition(labels, 200, 0.3, np.random.default_rng(42))
    assert min(len(p) for p in parts) >= 7


def test_the_cli_refuses_it_in_one_sentence_before_the_run_directory(tmp_path):
    from click.testing import CliRunner

    from hasfl_ray.cli.main import main

    result = CliRunner().invoke(main, ["simulate", "--dataset", "digits", "--clients", "200", "--clients-per-round",
                                       "10", "--rounds", "1", "--backend", "local", "--quiet", "--out",
                                       str(tmp_path / "run")])
    message = result.output.strip()
    assert result.exit_code == 2 and len(message.splitlines()) == 1 and len(message) < 207, message
    assert message.startswith("Error: partition dirichlet over 200 clients gave none each its even share"), message
    assert not (tmp_path / "run").exists()
