"""The label partitions beside Dirichlet: IID, HeteroFL's and FedRolex's non-IID-k (classes:K, checked against a
re-implementation of the source's code), exactly k classes per client (classes-even:K), label-sorted shards (McMahan
et al. 2017); each scheme's invariants, its seeding, and the sentence where it cannot apply."""

import numpy as np
import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.data import dirichlet_partition, load_dataset, partition_labels
from hasfl_ray.data.partition import label_split_partition
from hasfl_ray.config import RunConfig
from hasfl_ray.errors import ConfigError

#: 10 classes of unequal sizes (37..127 samples), in a scrambled order.
LABELS = np.random.default_rng(5).permutation(np.repeat(np.arange(10), np.arange(10) * 10 + 37))
SCHEMES = ("iid", "classes-even:2", "classes-even:3", "shards:2", "shards:5")


def parts_of(spec, clients=20, seed=42, labels=LABELS):
    return partition_labels(labels, clients, spec, 0.3, np.random.default_rng(seed))


@pytest.mark.parametrize("spec", SCHEMES + ("dirichlet",))
@pytest.mark.parametrize("clients", [7, 20])
def test_every_sample_is_assigned_exactly_once(spec, clients):
    parts = parts_of(spec, clients)
    assert len(parts) == clients and all(len(p) > 0 for p in parts)
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(LABELS)))
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)


@pytest.mark.parametrize("spec", SCHEMES)
def test_seeded_reproducible_and_different_seeds_differ(spec):
    a, b, c = parts_of(spec, seed=42), parts_of(spec, seed=42), parts_of(spec, seed=43)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_dirichlet_is_the_default_and_draws_exactly_as_before():
    ours = parts_of("dirichlet")
    before = dirichlet_partition(LABELS, 20, 0.3, np.random.default_rng(42))
    assert all(np.array_equal(x, y) for x, y in zip(ours, before))
    assert RunConfig(backend="local").partition == "dirichlet"


def test_iid_sizes_differ_by_at_most_one():
    sizes = [len(p) for p in parts_of("iid", 7)]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("k,clients", [(1, 10), (2, 20), (2, 7), (3, 20), (10, 4), (2, 5)])
def test_classes_even_holds_exactly_k_classes_spread_evenly(k, clients):
    parts = parts_of(f"classes-even:{k}", clients)
    held = [set(LABELS[p].tolist()) for p in parts]
    assert all(len(h) == k for h in held)
    holders = np.bincount([c for h in held for c in h], minlength=10)
    assert holders.sum() == k * clients and holders.max() - holders.min() <= 1  # every class held, evenly
    for label in range(10):  # a class's samples are split evenly over its holders (HeteroFL's shards)
        counts = [int((LABELS[p] == label).sum()) for p in parts if label in set(LABELS[p].tolist())]
        assert max(counts) - min(counts) <= 1


@pytest.mark.parametrize("s,clients", [(2, 20), (5, 7), (1, 10)])
def test_shards_give_each_client_s_label_sorted_shards(s, clients):
    parts = parts_of(f"shards:{s}", clients)
    total = s * clients
    sizes = [len(p) for p in parts]  # s shards of len // total or one more each
    assert all(s * (len(LABELS) // total) <= n <= s * (len(LABELS) // total + 1) for n in sizes)
    # a shard is contiguous in label order, so it spans few classes: at most s * (1 + classes a shard can cross)
    per_shard = -(-len(LABELS) // total)
    span = 1 + -(-per_shard // 37)  # the smallest class has 37 samples
    assert all(len(set(LABELS[p].tolist())) <= s * span for p in parts)
    # shards: two per client over 20 clients, 40 shards: with 10 classes most clients see 2-4 classes
    assert np.mean([len(set(LABELS[p].tolist())) for p in parts]) < 10


@pytest.mark.parametrize("spec,clients,match", [
    ("classes-even:11", 20, "training split has 10 classes; expected classes-even:K with K at most 10"),
    ("classes-even:2", 4, "8 class slots for the 10 classes; expected at least 5 clients"),
    ("classes:11", 20, "training split has 10 classes; expected classes:K with K at most 10"),
    ("classes:3", 7, "3 x 7 label slots do not divide evenly over the 10 classes"),
    ("classes:2", 500, "100 shards of each class, but class 0 has 37 training samples"),
    ("shards:100", 20, "2000 shards of the 820 training samples"),
])
def test_impossible_schemes_are_one_sentence(spec, clients, match):
    with pytest.raises(ConfigError, match=match):
        parts_of(spec, clients)


@pytest.mark.parametrize("spec", ["classes", "classes:0", "shards:-1", "dirichlet:2", "IID", 2, "shards:two"])
def test_bad_partition_is_one_sentence(spec):
    with pytest.raises(ConfigError, match=r"partition is .*; expected dirichlet .* iid, classes:K .* or shards:S"):
        RunConfig(backend="local", partition=spec)


def test_the_digits_loader_takes_the_partition():
    dataset = load_dataset("digits", 10, 0.3, 42, partition="classes-even:2")
    histograms = dataset.label_histograms()
    assert ((histograms > 0).sum(axis=1) == 2).all() and histograms.sum() == dataset.train_size
    assert dataset.client_test_indices is None and dataset.label_split is None


def test_the_digits_loader_gives_each_client_its_label_split_and_own_test_shard():
    dataset = load_dataset("digits", 10, 0.3, 42, partition="classes:2")
    test_y = dataset.test_y.numpy()
    shards = [ix.numpy() for ix in dataset.client_test_indices]
    for c, labels in enumerate(dataset.label_split):
        assert 1 <= len(labels) <= 2
        held = np.flatnonzero(dataset.label_histograms()[c])
        assert held.tolist() == labels  # trains on exactly its labels
        assert sorted(set(test_y[shards[c]].tolist())) == labels  # and is tested on its own shard of them
    flat = np.concatenate(shards)
    assert len(flat) == len(set(flat.tolist()))  # no test sample in two shards


@pytest.mark.parametrize("dataset", ["shakespeare", "synthetic"])
def test_a_dataset_with_its_own_clients_refuses_a_partition_in_one_sentence(dataset):
    with pytest.raises(ConfigError, match=f"partition is 'iid' but dataset '{dataset}' has its own clients"):
        RunConfig(backend="local", dataset=dataset, partition="iid").resolved()
    result = CliRunner().invoke(main, ["simulate", "--dataset", dataset, "--partition", "shards:2", "--backend",
                                       "local"])
    assert result.exit_code == 2 and "has its own clients" in result.output and "Traceback" not in result.output


def test_data_inspect_describes_the_partition():
    import json

    result = CliRunner().invoke(main, ["data", "inspect", "--partition", "classes:2", "--clients", "10", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["partition"] == "classes:2" and "HeteroFL's non-IID-2" in summary["partition_rule"]
    for row in summary["clients"]:
        assert [label for label, n in enumerate(row["label_histogram"]) if n] == row["label_split"]
        assert row["test_samples"] > 0
    text = CliRunner().invoke(main, ["data", "inspect", "--partition", "classes:2", "--clients", "10"])
    assert text.exit_code == 0 and "labels" in text.output and "test_shard" in text.output
    even = CliRunner().invoke(main, ["data", "inspect", "--partition", "classes-even:2", "--clients", "10", "--json"])
    rows = json.loads(even.output)["clients"]
    assert all(sum(1 for n in row["label_histogram"] if n) == 2 and "label_split" not in row for row in rows)
    text = CliRunner().invoke(main, ["data", "inspect", "--partition", "iid", "--clients", "5"])
    assert text.exit_code == 0 and "partition iid: IID" in text.output.splitlines()[0]
    bad = CliRunner().invoke(main, ["data", "inspect", "--partition", "pathological"])
    assert bad.exit_code == 2 and "partition is 'pathological'" in bad.output


@pytest.mark.parametrize("name,make", [("emnist", "make_emnist_root"), ("cifar10", "make_cifar_root")])
def test_the_image_loaders_take_the_partition(tmp_path, name, make):
    import dataset_files

    getattr(dataset_files, make)(tmp_path)
    iid = load_dataset(name, 4, 0.3, 42, str(tmp_path), partition="iid")
    sizes = iid.client_sizes()
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == iid.train_size
    shards = load_dataset(name, 4, 0.3, 42, str(tmp_path), partition="shards:2")
    assert sum(shards.client_sizes()) == shards.train_size
    assert not np.array_equal(np.asarray(iid.label_histograms()), np.asarray(shards.label_histograms()))


# -- classes:K against the source ------------------------------------------------------------------------------


def source_non_iid(labels, num_users, k, classes_size, rng, label_split=None):
    """HeteroFL's ``src/data.py::non_iid`` (diaoenmao/HeteroFL-...-Heterogeneous-Clients at cc40f3e; FedRolex's
    ``data.py::non_iid`` is the same), transcribed statement by statement: its two torch draws become draws of ``rng``
    (``torch.randperm(len(label_split))`` -> ``rng.permutation``, ``torch.randperm(n)[0]`` -> ``rng.integers(n)``)."""
    label = np.array(labels)
    shard_per_user = k
    data_split = {i: [] for i in range(num_users)}
    label_idx_split = {}
    for i in range(len(label)):
        label_i = label[i].item()
        if label_i not in label_idx_split:
            label_idx_split[label_i] = []
        label_idx_split[label_i].append(i)
    shard_per_class = int(shard_per_user * num_users / classes_size)
    for label_i in label_idx_split:
        label_idx = label_idx_split[label_i]
        num_leftover = len(label_idx) % shard_per_class
        leftover = label_idx[-num_leftover:] if num_leftover > 0 else []
        new_label_idx = np.array(label_idx[:-num_leftover]) if num_leftover > 0 else np.array(label_idx)
        new_label_idx = new_label_idx.reshape((shard_per_class, -1)).tolist()
        for i, leftover_label_idx in enumerate(leftover):
            new_label_idx[i] = np.concatenate([new_label_idx[i], [leftover_label_idx]])
        label_idx_split[label_i] = new_label_idx
    if label_split is None:
        label_split = list(range(classes_size)) * shard_per_class
        label_split = np.array(label_split)[rng.permutation(len(label_split))].tolist()
        label_split = np.array(label_split).reshape((num_users, -1)).tolist()
        for i in range(len(label_split)):
            label_split[i] = np.unique(label_split[i]).tolist()
    for i in range(num_users):
        for label_i in label_split[i]:
            idx = int(rng.integers(len(label_idx_split[label_i])))
            data_split[i].extend(label_idx_split[label_i].pop(idx))
    return data_split, label_split


TEST_LABELS = np.random.default_rng(6).permutation(np.repeat(np.arange(10), 40 + np.arange(10)))


@pytest.mark.parametrize("clients,k,seed", [(10, 2, 0), (20, 2, 1), (100, 2, 2), (5, 2, 3), (20, 3, 4), (10, 10, 5),
                                            (100, 1, 6)])
def test_classes_k_is_the_sources_non_iid_for_the_training_and_the_test_split(clients, k, seed):
    train, test, labels = label_split_partition(LABELS, TEST_LABELS, clients, k, np.random.default_rng(seed))
    rng = np.random.default_rng(seed)
    source_train, source_labels = source_non_iid(LABELS, clients, k, 10, rng)
    source_test, _ = source_non_iid(TEST_LABELS, clients, k, 10, rng, source_labels)  # split_dataset's second call
    assert labels == source_labels
    assert [p.tolist() for p in train] == [sorted(int(i) for i in source_train[c]) for c in range(clients)]
    assert [p.tolist() for p in test] == [sorted(int(i) for i in source_test[c]) for c in range(clients)]


def test_classes_k_gives_many_label_sets_where_classes_even_pairs_fixed_partners():
    """At 100 clients, K = 2 on 10 classes the sources' label split gives dozens of distinct label sets (about 47 in
    expectation); the even rule of classes-even pairs each class with a fixed partner (5 sets)."""
    def distinct(spec):
        return len({tuple(sorted(set(LABELS[p].tolist()))) for p in parts_of(spec, 100)})

    assert distinct("classes:2") > 30
    assert distinct("classes-even:2") <= 10
    _, _, labels = label_split_partition(LABELS, None, 100, 2, np.random.default_rng(0))
    assert any(len(held) == 1 for held in labels)  # a row that repeats a label: that client holds one class


# -- balanced-dirichlet against FIARSE ----------------------------------------------------------------------------


def source_balanced_dirichlet(labels, n, alpha, rng):
    """FIARSE's ``data/data_utils.py::BalancedDirichlet.partition_approach`` (HarliWu/FIARSE at 281519c), transcribed
    with ``np.random`` replaced by ``rng`` call for call (the final per-client shuffle dropped: indices are sorted)."""
    labelList_true = np.array(labels)
    K = len(np.unique(labelList_true))
    N = len(labelList_true)
    p_client = np.zeros((n, K))
    for i in range(n):
        p_client[i] = rng.dirichlet(np.repeat(alpha, K))
    p_client_cdf = np.cumsum(p_client, axis=1)
    idx_batch = [[] for _ in range(n)]
    m = int(N / n)
    idx_labels = [np.where(labelList_true == k)[0] for k in range(K)]
    idx_counter = [0 for k in range(K)]
    total_cnt = 0
    while total_cnt < m * n:
        curr_clnt = rng.integers(n)
        if len(idx_batch[curr_clnt]) >= m:
            continue
        total_cnt += 1
        curr_prior = p_client_cdf[curr_clnt]
        while True:
            cls_label = np.argmax(rng.uniform() <= curr_prior)
            if idx_counter[cls_label] >= len(idx_labels[cls_label]):
                continue
            idx_batch[curr_clnt].append(idx_labels[cls_label][idx_counter[cls_label]])
            idx_counter[cls_label] += 1
            break
    return [sorted(int(i) for i in batch) for batch in idx_batch]


# (10, 0.3, 1) and (20, 0.3, 7): a sample takes 80,042 and 31,881 redraws (past ONE_BY_ONE: the block path); seeds 0
# and 1 took tens of millions, 4 minutes and 22 s of the transcription's draws one at a time
@pytest.mark.parametrize("clients,alpha,seed", [(10, 0.3, 1), (20, 0.3, 7), (7, 1.0, 2), (40, 0.1, 3)])
def test_balanced_dirichlet_is_fiarses(clients, alpha, seed):
    ours = partition_labels(LABELS, clients, "balanced-dirichlet", alpha, np.random.default_rng(seed))
    theirs = source_balanced_dirichlet(LABELS, clients, alpha, np.random.default_rng(seed))
    assert [p.tolist() for p in ours] == theirs
    assert {len(p) for p in ours} == {len(LABELS) // clients}  # equal client sizes
    assert len(set(np.concatenate(ours).tolist())) == clients * (len(LABELS) // clients)  # no sample twice
    held = [np.bincount(LABELS[p], minlength=10) for p in ours]
    assert max(np.count_nonzero(h) for h in held) < 10 or alpha >= 1.0  # a label skew at small alpha


def test_data_inspect_names_the_balanced_dirichlet():
    import json

    result = CliRunner().invoke(main, ["data", "inspect", "--partition", "balanced-dirichlet", "--clients", "10",
                                       "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert "FIARSE's balanced Dirichlet" in summary["partition_rule"]
    assert len({row["num_samples"] for row in summary["clients"]}) == 1
