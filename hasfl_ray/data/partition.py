"""Seeded label partitions (Dirichlet, IID, k classes per client, label-sorted shards) and capacity tiers."""

from __future__ import annotations

import bisect
import math
import numbers
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from hasfl_ray.errors import ConfigError
from hasfl_ray.federation import PAPER_SHARES, PAPER_WIDTHS, largest_remainder, parse_partition

#: Capacity tiers p_max and their probabilities: constrained devices are more prevalent, mean 0.525 (the default
#: width ladder, :class:`hasfl_ray.federation.WidthLadder`).
TIERS = PAPER_WIDTHS
TIER_PROBABILITIES = PAPER_SHARES


#: The tier mix of the paper's own runs (its Figure 5's p^max vector): 4/10/3/3 clients, mean 0.5625.
PAPER_RUNS_TIER_COUNTS = (4, 10, 3, 3)


def tier_counts(num_clients: int, probabilities: Sequence[float] = TIER_PROBABILITIES) -> np.ndarray:
    """Clients per tier by largest remainder of ``probabilities * num_clients`` (20 clients: 8/5/4/3)."""
    return largest_remainder(num_clients, probabilities)


def assign_tiers(num_clients: int, rng: np.random.Generator, tiers: Sequence[float] = TIERS,
                 probabilities: Sequence[float] = TIER_PROBABILITIES,
                 counts: Optional[Sequence[int]] = None) -> np.ndarray:
    """p_max per client: ``counts`` clients per tier (default :func:`tier_counts` of ``probabilities``), shuffled.

    With 20 clients the default gives exactly 8/5/4/3 clients at 0.25/0.5/0.75/1.0 (mean 0.525, the paper's
    text); ``counts=(4, 10, 3, 3)`` gives the mix of the paper's own runs (mean 0.5625). Every seed redraws which
    client gets which tier (one permutation of ``rng`` either way).
    """
    counts = tier_counts(num_clients, probabilities) if counts is None else np.asarray(counts, dtype=int)
    if counts.sum() != num_clients or len(counts) != len(tiers):
        raise ConfigError(f"tier_counts is {list(map(int, counts))}; expected {len(tiers)} counts (tiers "
                          f"{', '.join(map(str, tiers))}) that add up to the {num_clients} clients")
    p_max = np.repeat(np.asarray(tiers, dtype=np.float64), counts)
    return p_max[rng.permutation(num_clients)]


def dirichlet_partition(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator,
                        min_size: int = 10, max_tries: int = 1000) -> List[np.ndarray]:
    """Split sample indices over clients with Dirichlet(alpha) label skew.

    For each class, its samples are shuffled and divided among clients by proportions drawn from
    Dir(alpha). The draw is repeated until every client holds at least ``min_size`` samples
    (capped at an even share when the dataset is too small), so no client is empty.

    Returns:
        Per client, a sorted int64 array of indices into ``labels``.
    """
    labels = np.asarray(labels)
    if len(labels) < num_clients:
        raise ConfigError(f"{len(labels)} samples cannot give each of {num_clients} clients one; pass fewer --clients")
    requested, min_size = min_size, min(min_size, len(labels) // num_clients)
    classes = np.unique(labels)
    for _ in range(max_tries):
        buckets: List[List[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            proportions = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(proportions)[:-1] * len(idx)).astype(int)
            for client, part in enumerate(np.split(idx, cuts)):
                buckets[client].append(part)
        parts = [np.sort(np.concatenate(b)).astype(np.int64) for b in buckets]
        if min(len(p) for p in parts) >= max(min_size, 1):
            return parts
    if min_size < requested:  # the even share itself: every client needs the mean, which no alpha makes likely
        raise ConfigError(f"partition dirichlet over {num_clients} clients gave none each its even share of the "
                          f"{len(labels)} samples ({min_size}) in {max_tries} draws, nor would any alpha; expected "
                          "fewer --clients, or --partition balanced-dirichlet or iid")
    raise ConfigError(f"could not draw a Dirichlet(alpha={alpha}) partition giving every one of {num_clients} "
                      f"clients at least {min_size} samples in {max_tries} tries; expected a larger --alpha, fewer "
                      "--clients, or --partition balanced-dirichlet (equal client sizes)")


def check_alpha(alpha: float) -> None:
    """One sentence for a Dirichlet ``alpha`` that is not a finite number above 0 (NaN and infinity included, which
    a caller such as ``data inspect`` may pass: Dirichlet(NaN) draws NaN proportions and Dirichlet(inf) none)."""
    if not isinstance(alpha, numbers.Real) or isinstance(alpha, bool) or not math.isfinite(alpha) or not alpha > 0:
        raise ConfigError(f"alpha is {alpha!r}; expected a finite number > 0 (the Dirichlet concentration: "
                          "not NaN or infinity)")


def partition_labels(labels: np.ndarray, num_clients: int, spec: str, alpha: float, rng: np.random.Generator,
                     min_size: int = 10) -> List[np.ndarray]:
    """The training split's part of :func:`partition_splits` (no test shards)."""
    return partition_splits(labels, None, num_clients, spec, alpha, rng, min_size)[0]


def partition_splits(labels: np.ndarray, test_labels: Optional[np.ndarray], num_clients: int, spec: str,
                     alpha: float, rng: np.random.Generator, min_size: int = 10, seed: Optional[int] = None
                     ) -> Tuple[List[np.ndarray], Optional[List[np.ndarray]], Optional[List[List[int]]]]:
    """Split sample indices over clients by the scheme ``spec`` names (config ``partition``: ``dirichlet``, ``iid``,
    ``classes:K``, ``classes-even:K``, ``shards:S``; :func:`hasfl_ray.federation.parse_partition`), every draw from
    ``rng``. ``dirichlet`` is :func:`dirichlet_partition` with ``alpha`` and ``min_size`` (exactly the draws of a run
    before the other schemes existed); the others ignore both. ``classes:K`` is the sources' rule
    (:func:`label_split_partition`), which also splits the test set with the clients' label split.

    Returns:
        (per client a sorted int64 array of indices into ``labels``, per client its test indices into
        ``test_labels`` or None, per client its labels or None): the test shards and label split only for
        ``classes:K`` (given ``test_labels``). ``flwr:...`` is Flower Datasets' partitioner seeded with ``seed`` (the
        run's seed; drawn from ``rng`` where not given).
    """
    scheme, k = parse_partition(spec)
    labels = np.asarray(labels)
    if scheme in ("dirichlet", "balanced-dirichlet"):
        check_alpha(alpha)
    if scheme.startswith("flwr:"):  # Flower Datasets' own partitioner, seeded with the run's seed (data/flower.py)
        from hasfl_ray.data.flower import flwr_partition

        seed = int(rng.integers(2 ** 31)) if seed is None else seed
        return flwr_partition(scheme, labels, num_clients, seed), None, None
    if scheme == "dirichlet":
        return dirichlet_partition(labels, num_clients, alpha, rng, min_size=min_size), None, None
    if len(labels) < num_clients:
        raise ConfigError(f"{len(labels)} samples cannot give each of {num_clients} clients one; pass fewer --clients")
    if scheme == "iid":
        return iid_partition(len(labels), num_clients, rng), None, None
    if scheme == "balanced-dirichlet":
        return balanced_dirichlet_partition(labels, num_clients, alpha, rng), None, None
    if scheme == "classes":
        return label_split_partition(labels, test_labels, num_clients, k, rng)
    if scheme == "classes-even":
        return class_partition(labels, num_clients, k, rng), None, None
    return shard_partition(labels, num_clients, k, rng), None, None


def _sorted_parts(parts: Sequence[np.ndarray]) -> List[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


#: The most times :func:`balanced_dirichlet_partition` redraws one sample's class before it refuses the partition:
#: FIARSE's rule redraws until the class has samples left, which at a small alpha can take for ever.
MAX_REDRAWS = 100_000_000


def balanced_dirichlet_partition(labels: np.ndarray, num_clients: int, alpha: float,
                                 rng: np.random.Generator) -> List[np.ndarray]:
    """FIARSE's balanced Dirichlet (HarliWu/FIARSE ``data/data_utils.py::BalancedDirichlet``; ``balanced-dirichlet``):
    every client draws its label proportions from Dirichlet(``alpha``) over the C classes (client by client) and
    holds exactly m = floor(N / clients) samples. Sample by sample, a uniformly drawn client that is not yet full
    takes the next unused sample (in index order) of a class drawn from its proportions, the class redrawn while it
    is used up; the N mod clients samples left over are held by no one. Every draw comes from ``rng``, exactly as the
    source draws them wherever the source ends.

    The source's redraw has no bound: once a client's likely classes are used up it loops for ever (at alpha 0.1
    over 20 clients of the digits, or whenever its proportions put no mass at all on the classes left). Here a
    client whose proportions can draw none of the classes left, or a sample whose class took more than
    :data:`MAX_REDRAWS` redraws, is refused in one sentence (ConfigError) naming alpha, the clients and the bound."""
    labels = np.asarray(labels)
    classes = np.unique(labels)
    proportions = np.stack([rng.dirichlet(np.repeat(alpha, len(classes))) for _ in range(num_clients)])
    cdf = np.cumsum(proportions, axis=1)
    rows = cdf.tolist()  # bisect on each row: the first class whose cumulative share reaches u (numpy's argmax)
    # the chance that a draw lands on each class: its step of the cdf, and class 0 also past the last entry
    # (argmax of all-False is 0 where rounding left the cdf's end below u)
    chance = np.diff(cdf, axis=1, prepend=0.0)
    chance[:, 0] += np.maximum(0.0, 1.0 - cdf[:, -1])
    per_client = len(labels) // num_clients
    by_class = [np.flatnonzero(labels == c) for c in classes]
    used = [0] * len(classes)
    left = np.array([len(b) > 0 for b in by_class])
    mass = chance[:, left].sum(axis=1)  # per client, the chance that one draw lands on a class with samples left
    parts: List[List[int]] = [[] for _ in range(num_clients)]
    total, last = 0, len(classes) - 1
    while total < per_client * num_clients:
        client = int(rng.integers(num_clients))
        if len(parts[client]) >= per_client:
            continue
        total += 1
        if mass[client] <= 0.0:
            raise _unbounded_draw(alpha, num_clients, client, 0.0)
        label = _draw_class(rng, rows[client], cdf[client], used, by_class, left)
        if label < 0:
            raise _unbounded_draw(alpha, num_clients, client, float(mass[client]))
        parts[client].append(int(by_class[label][used[label]]))
        used[label] += 1
        if used[label] == len(by_class[label]):  # the class is used up: no draw of it counts any more
            left[label] = False
            mass = chance[:, left].sum(axis=1)
    return _sorted_parts(parts)


#: Redraws of a sample's class made one at a time before :func:`_draw_class` draws them in blocks.
ONE_BY_ONE = 64


def _draw_class(rng: np.random.Generator, row: List[float], cdf: np.ndarray, used: List[int],
                by_class: Sequence[np.ndarray], left: np.ndarray) -> int:
    """The class FIARSE's loop settles on for one sample (``u = rng.uniform()``, the first class whose cumulative
    share reaches u, redrawn while that class is used up), leaving ``rng`` exactly where that loop leaves it; -1
    past :data:`MAX_REDRAWS` redraws. Past the first few, the uniforms are drawn in blocks (``rng.random(n)`` gives
    the doubles n calls of ``rng.uniform()`` give), and the generator is then set back and moved by exactly the
    draws the loop would have made: a class with 1e-8 of the chance takes 10^8 redraws, seconds rather than hours."""
    last = len(row) - 1
    for _ in range(ONE_BY_ONE):
        label = bisect.bisect_left(row, rng.uniform())
        label = 0 if label > last else label
        if used[label] < len(by_class[label]):
            return label
    drawn, block = ONE_BY_ONE, 4096
    while drawn < MAX_REDRAWS:
        block = min(block, MAX_REDRAWS - drawn)
        state = rng.bit_generator.state
        labels = np.searchsorted(cdf, rng.random(block), side="left")
        labels[labels > last] = 0
        hits = np.flatnonzero(left[labels])
        if len(hits):
            rng.bit_generator.state = state
            rng.random(int(hits[0]) + 1)  # the draws up to the first class with samples left, none after it
            return int(labels[hits[0]])
        drawn, block = drawn + block, min(2 * block, 1 << 20)
    return -1


def _unbounded_draw(alpha: float, num_clients: int, client: int, mass: float) -> ConfigError:
    share = "none of their mass" if mass == 0.0 else f"only {mass:.2g} of their mass"
    return ConfigError(f"partition 'balanced-dirichlet' with alpha {alpha:g} over {num_clients} clients cannot be "
                       f"drawn: client {client}'s label proportions put {share} on the classes that still have "
                       f"samples, and FIARSE's rule redraws a sample's class until it has one (bound: "
                       f"{MAX_REDRAWS:,} redraws a sample); expected a larger --alpha or fewer --clients (or "
                       "--partition dirichlet)")


def iid_partition(num_samples: int, num_clients: int, rng: np.random.Generator) -> List[np.ndarray]:
    """IID: one seeded permutation of the samples cut into ``num_clients`` parts whose sizes differ by at most one
    (the first ``num_samples % num_clients`` clients hold one more)."""
    return _sorted_parts(np.array_split(rng.permutation(num_samples), num_clients))


def class_partition(labels: np.ndarray, num_clients: int, k: int, rng: np.random.Generator) -> List[np.ndarray]:
    """k classes per client (HeteroFL's and FedRolex's non-IID-k, e.g. k = 2): every client holds exactly ``k``
    distinct classes and every sample is held by exactly one client.

    1. Class slots: the k·N slots go to the C classes as evenly as possible, each class to ⌊kN/C⌋ or ⌈kN/C⌉
       clients (the classes that get one more are the first kN mod C of a seeded permutation of the classes).
    2. Holders: the slots, grouped by class in that permuted order, are dealt in turn to the clients of a seeded
       permutation (slot j to client j mod N): a class's slots are at most N consecutive ones, so no client
       gets a class twice and each gets exactly k.
    3. Shards: each class's samples, shuffled, are cut into as many shards as it has holders (sizes within one of
       each other, HeteroFL's rule: the class's samples split evenly over the shards of it that clients hold), one
       shard per holder.

    ``classes-even:K``. HeteroFL (its ``non_iid``: ``classes:K``, :func:`label_split_partition`) cuts each class into
    kN/C shards and deals a shuffled list of class labels k to a client, so a client whose k labels repeat one holds
    fewer than k classes and shards are left unused; this rule gives every client exactly k classes and uses every
    sample, but pairs each class with few fixed partners (5 distinct label sets for 10 to 100 clients on 10 classes
    at k = 2, against about 47 at 100 clients under HeteroFL's). Needs k ≤ C ≤ k·N (else one sentence).
    """
    classes = np.unique(labels)
    num_classes = len(classes)
    if not 1 <= k <= num_classes:
        raise ConfigError(f"partition is 'classes-even:{k}' but the training split has {num_classes} classes; "
                          f"expected classes-even:K with K at most {num_classes}")
    if k * num_clients < num_classes:
        raise ConfigError(f"partition is 'classes-even:{k}' with {num_clients} clients, {k * num_clients} class slots for "
                          f"the {num_classes} classes; expected at least {-(-num_classes // k)} clients (or a larger "
                          "K) so that every class has a holder")
    order = classes[rng.permutation(num_classes)]
    holders_per_class = np.full(num_classes, (k * num_clients) // num_classes)
    holders_per_class[:(k * num_clients) % num_classes] += 1
    clients = rng.permutation(num_clients)
    buckets: List[List[np.ndarray]] = [[] for _ in range(num_clients)]
    start = 0  # slot j (0 <= j < k·N) goes to clients[j % N]
    for label, holders in zip(order, holders_per_class):
        samples = rng.permutation(np.flatnonzero(labels == label))
        if len(samples) < holders:
            raise ConfigError(f"partition is 'classes-even:{k}' with {num_clients} clients but class {label} has "
                              f"{len(samples)} training samples for its {holders} holders; expected fewer --clients "
                              "or a smaller K")
        for j, shard in zip(range(start, start + holders), np.array_split(samples, holders)):
            buckets[clients[j % num_clients]].append(shard)
        start += holders
    return _sorted_parts([np.concatenate(b) for b in buckets])


def label_split_partition(train_labels: np.ndarray, test_labels: Optional[np.ndarray], num_clients: int, k: int,
                          rng: np.random.Generator) -> Tuple[List[np.ndarray], Optional[List[np.ndarray]],
                                                             List[List[int]]]:
    """Non-IID-k as HeteroFL and FedRolex draw it (``src/data.py::non_iid``, identical in both; ``classes:K``).

    With C classes and N clients, shard_per_class = K·N/C:

    1. Shards: each class's sample indices, in index order, are cut into shard_per_class contiguous shards of equal
       size, the class's leftover samples (its count mod shard_per_class) added one each to its first shards.
    2. The label split: the list ``[0, 1, ..., C-1] * shard_per_class`` in a seeded random order (one
       ``rng.permutation``), cut into N rows of K, each row's labels made unique and sorted, so a client whose row
       repeats a label holds fewer than K classes.
    3. Training samples: client by client, label by label (ascending), the client takes a uniformly drawn one of the
       shards of that label still left (``rng.integers``), so some shards stay unused when rows repeat a label.
    4. The test split the same way, with the same label split: each client's own test shard.

    Returns:
        (training indices per client, test indices per client (None without ``test_labels``), each client's labels),
        indices sorted int64 arrays.
        Needs K·N divisible by C and every class with at least shard_per_class samples in each split (else one
        sentence).
    """
    train_labels = np.asarray(train_labels)
    classes = np.unique(train_labels)
    num_classes = len(classes)
    if not 1 <= k <= num_classes:
        raise ConfigError(f"partition is 'classes:{k}' but the training split has {num_classes} classes; expected "
                          f"classes:K with K at most {num_classes}")
    if (k * num_clients) % num_classes:
        raise ConfigError(f"partition is 'classes:{k}' with {num_clients} clients: {k} x {num_clients} label slots do "
                          f"not divide evenly over the {num_classes} classes; expected K x clients to be a multiple "
                          f"of {num_classes} (HeteroFL's shard_per_class = K x clients / classes)")
    per_class = k * num_clients // num_classes

    def shards_of(labels: np.ndarray, split: str) -> Dict[int, List[np.ndarray]]:
        shards = {}
        for label in classes:
            indices = np.flatnonzero(labels == label)
            if len(indices) < per_class:
                raise ConfigError(f"partition is 'classes:{k}' with {num_clients} clients, {per_class} shards of each "
                                  f"class, but class {label} has {len(indices)} {split} samples; expected at least "
                                  f"{per_class} (fewer --clients or a smaller K)")
            leftover = len(indices) % per_class
            even = indices[:len(indices) - leftover].reshape(per_class, -1)
            pieces = [np.asarray(row) for row in even]
            for i, extra in enumerate(indices[len(indices) - leftover:]):
                pieces[i] = np.append(pieces[i], extra)
            shards[int(label)] = pieces
        return shards

    train_shards = shards_of(train_labels, "training")
    test_shards = shards_of(np.asarray(test_labels), "test") if test_labels is not None else None
    slots = np.tile(classes, per_class)[rng.permutation(num_classes * per_class)].reshape(num_clients, k)
    label_split = [sorted(int(c) for c in np.unique(row)) for row in slots]

    def deal(shards: Dict[int, List[np.ndarray]]) -> List[np.ndarray]:
        parts = []
        for labels in label_split:
            taken = [shards[label].pop(int(rng.integers(len(shards[label])))) for label in labels]
            parts.append(np.concatenate(taken))
        return _sorted_parts(parts)

    train = deal(train_shards)
    return train, (deal(test_shards) if test_shards is not None else None), label_split


def shard_partition(labels: np.ndarray, num_clients: int, shards: int, rng: np.random.Generator) -> List[np.ndarray]:
    """Label-sorted shards (McMahan et al. 2017, "pathological non-IID": 200 shards of 300 MNIST digits, two per
    client): the samples, in a seeded order sorted stably by label, are cut into ``shards``·N contiguous shards of
    sizes within one of each other, and each client gets ``shards`` of them, dealt from a seeded permutation of the
    shards (client i: the permutation's entries i·S to i·S + S − 1). Each client sees the few classes its shards
    span."""
    total = shards * num_clients
    if total > len(labels):
        raise ConfigError(f"partition is 'shards:{shards}' with {num_clients} clients, {total} shards of the "
                          f"{len(labels)} training samples; expected at most {len(labels)} shards (fewer --clients "
                          "or shards per client)")
    by_label = rng.permutation(len(labels))
    by_label = by_label[np.argsort(labels[by_label], kind="stable")]
    pieces = np.array_split(by_label, total)
    dealt = rng.permutation(total).reshape(num_clients, shards)
    return _sorted_parts([np.concatenate([pieces[s] for s in row]) for row in dealt])
