"""The evaluation that sub-model FL papers report, as plain computation (docs/metrics.md).

- Accuracy at each width (FjORD's per-p accuracy, HeteroFL's levels): which widths, on which rounds, under which key.
- Local accuracy per client (HeteroFL's "local"): client i is scored on the global test samples whose label is in
  L_i (the labels with a nonzero count in its training partition), at its own width, the prediction being the
  argmax over the logits restricted to L_i (masked) or over every logit (unmasked).

It is computed once for every client, not per client: one forward pass per distinct sub-model over the test set
gives, for each sample s, the bitmask of the classes that *beat* its label y_s (class c beats y when
logit_c > logit_y, or logit_c = logit_y with c < y: argmax's first-index rule), so client i's masked prediction on s
is right iff ``beats[s] & mask_i == 0``, its unmasked one iff ``beats[s] == 0``. The per-client counts are numpy
operations over the distinct (sub-model, label set) pairs; :func:`reference_local_accuracies` is the per-client
float64 loop they are tested against.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

#: ``local_eval_clients``'s default: the local-accuracy pass scores every client up to this many clients and a seeded
#: sample of this many beyond (its cost grows with the clients scored: the synthetic dataset regenerates each
#: one's labels, about 3 s per 10,000; at 10^7 clients every client took about 70 minutes).
LOCAL_EVAL_CLIENTS = 10_000

#: Elements of the (pairs x samples x words) array :func:`local_accuracies` holds at a time.
CHUNK_ELEMENTS = 1 << 22


def width_key(width: float) -> str:
    """The key of width ``width`` in metrics.jsonl and summary.json: ``format(w, "g")`` ("0.25", "1")."""
    return format(float(width), "g")


def default_eval_widths(p_max: np.ndarray) -> List[float]:
    """The default ``eval_widths``: the distinct p^max of the run's tiers, and 1.0, ascending."""
    return sorted({float(p) for p in np.unique(np.asarray(p_max, dtype=np.float64))} | {1.0})


def is_eval_round(round: int, rounds: int, every: int, phase: Optional[int] = None) -> bool:
    """Whether round ``round`` (0-based) of ``rounds`` evaluates at each width: every ``every`` rounds, on the 1-based
    rounds t with t % every == phase % every (None: ``every``, i.e. ``(round + 1) % every == 0``), and always the
    last; ``every`` 0 means the last round only."""
    if round + 1 == rounds:
        return True
    if every <= 0:
        return False
    return (round + 1) % every == (every if phase is None else phase) % every


def evaluation_round(round: int, rounds: int, test_every: int, eval_every: int, test_first: bool = False,
                     test_last: int = 0, test_phase: Optional[int] = None) -> Tuple[bool, bool]:
    """Whether round ``round`` (0-based) of ``rounds`` evaluates test_accuracy, and whether it also evaluates every
    other width: the test cadence (:func:`is_eval_round` of ``test_every``), widths on the rounds that are also on
    ``eval_every``'s, both through the 1-based round ``test_phase`` (None: rounds K, 2K, ... of each); the first
    round (``test_first``) and each of the last ``test_last`` rounds are both."""
    also = (round == 0 and test_first) or round >= rounds - test_last
    tested = also or is_eval_round(round, rounds, test_every, test_phase)
    return tested, tested and (also or is_eval_round(round, rounds, eval_every, test_phase))


def submodel_groups(widths: np.ndarray, channel_shapes) -> Tuple[List[float], np.ndarray]:
    """Clients whose widths give the same sub-model share one forward pass.

    Args:
        widths: each client's width, float64 (N,).
        channel_shapes: width -> a hashable description of the sub-model's shapes (every parameter's sliced shape).

    Returns:
        (the width that stands for each group, the smallest of its widths, ascending; each client's group, int64
        (N,)).
    """
    distinct, inverse = np.unique(np.asarray(widths, dtype=np.float64), return_inverse=True)
    representative: Dict[object, float] = {}
    group_of_distinct = []
    for w in distinct.tolist():  # ascending: the first width of a shape is its smallest
        shape = channel_shapes(w)
        representative.setdefault(shape, w)
        group_of_distinct.append(shape)
    order = sorted(representative.values())
    index = {shape: order.index(w) for shape, w in representative.items()}
    groups = np.asarray([index[shape] for shape in group_of_distinct], dtype=np.int64)[inverse.reshape(-1)]
    return order, groups


def beats(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """bool (B, C): class c beats label y_s of sample s (logit_c > logit_y, or equal with c < y).

    A NaN is never a right answer: a class whose logit is NaN beats the label (argmax takes a NaN for the largest
    value), and a sample whose label's logit is NaN is beaten by every class, its label included, so it is wrong
    under any label mask (a NaN compares false with everything: the plain rule let a NaN model score 100 %)."""
    label_logit = logits.gather(1, labels.view(-1, 1))
    lower = torch.arange(logits.shape[1], device=logits.device).view(1, -1) < labels.view(-1, 1)
    return (logits > label_logit) | ((logits == label_logit) & lower) | torch.isnan(logits) | \
        torch.isnan(label_logit)


def right(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """bool (B,): the top-1 prediction of sample s is its label: no class beats it (:func:`beats`; argmax's
    first-index rule for ties, a NaN never right)."""
    return ~beats(logits, labels).any(dim=1)


def pack_bits(bits: np.ndarray) -> np.ndarray:
    """bool (..., C) as uint64 (..., ceil(C / 64)) words, class c at bit c % 64 of word c // 64."""
    bits = np.asarray(bits, dtype=bool)
    words = -(-bits.shape[-1] // 64) if bits.shape[-1] else 1
    padded = np.zeros(bits.shape[:-1] + (words * 64,), dtype=bool)
    padded[..., :bits.shape[-1]] = bits
    return np.packbits(padded, axis=-1, bitorder="little").view("<u8")


def local_accuracies(labels: np.ndarray, beats_packed: np.ndarray, groups: np.ndarray,
                     label_counts: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every client's local accuracy from the test set's beats bitmasks.

    Args:
        labels: the test samples' labels, int (S,).
        beats_packed: :func:`pack_bits` of :func:`beats` for each group's sub-model, uint64 (G, S, W).
        groups: each client's group, int (N,).
        label_counts: each client's training label histogram, (N, C); L_i = its nonzero classes.

    Returns:
        (masked accuracy, unmasked accuracy, test samples scored), float64, float64, int64, each (N,); the
        accuracies are NaN for a client with no test sample of its labels.
    """
    labels = np.asarray(labels, dtype=np.int64)
    groups = np.asarray(groups, dtype=np.int64)
    held = np.asarray(label_counts) > 0  # (N, C)
    num_classes = held.shape[1]
    per_class = np.bincount(labels, minlength=num_classes)[:num_classes]
    samples = held.astype(np.int64) @ per_class
    # unmasked: right iff nothing beats the label; counted per (group, class)
    right = ~np.any(beats_packed != 0, axis=-1)  # (G, S)
    right_per_class = np.stack([np.bincount(labels[r], minlength=num_classes)[:num_classes] for r in right]) \
        if len(right) else np.zeros((0, num_classes), dtype=np.int64)
    unmasked_right = np.einsum("nc,nc->n", held.astype(np.int64), right_per_class[groups]) if len(groups) else \
        np.zeros(0, dtype=np.int64)
    # masked: one count per distinct (group, label set) pair
    masks = pack_bits(held)  # (N, W)
    keys = np.concatenate([groups[:, None].astype(np.uint64), masks], axis=1)
    pairs, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    pair_right = np.zeros(len(pairs), dtype=np.int64)
    num_samples, words = beats_packed.shape[1], beats_packed.shape[2]
    step = max(1, CHUNK_ELEMENTS // max(1, num_samples * words))
    label_word, label_bit = labels // 64, (labels % 64).astype(np.uint64)
    for start in range(0, len(pairs), step):
        chunk = pairs[start:start + step]
        group, mask = chunk[:, 0].astype(np.int64), chunk[:, 1:]
        in_set = ((mask[:, label_word] >> label_bit) & np.uint64(1)).astype(bool)  # (K, S): y_s in L
        unbeaten = ~np.any(beats_packed[group] & mask[:, None, :], axis=-1)  # (K, S)
        pair_right[start:start + len(chunk)] = np.count_nonzero(in_set & unbeaten, axis=1)
    masked_right = pair_right[inverse]
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = np.where(samples > 0, samples, np.nan)
        return masked_right / scale, unmasked_right / scale, samples


def reference_local_accuracies(labels: np.ndarray, logits: np.ndarray, groups: np.ndarray,
                               label_counts: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`local_accuracies` the plain way, client by client in float64 torch, from the logits (G, S, C)."""
    labels_t = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
    logits_t = torch.as_tensor(np.asarray(logits), dtype=torch.float64)
    masked, unmasked, samples = [], [], []
    for group, counts in zip(np.asarray(groups).tolist(), np.asarray(label_counts)):
        held = torch.as_tensor(counts > 0)
        chosen = held[labels_t]
        scores, y = logits_t[group][chosen], labels_t[chosen]
        samples.append(int(chosen.sum()))
        restricted = scores.masked_fill(~held.view(1, -1), -torch.inf)
        finite = ~torch.isnan(scores.gather(1, y.view(-1, 1)).view(-1))  # a NaN label logit is never right
        masked.append(float(((restricted.argmax(1) == y) & finite).double().mean()) if len(y) else float("nan"))
        unmasked.append(float(((scores.argmax(1) == y) & finite).double().mean()) if len(y) else float("nan"))
    return np.asarray(masked), np.asarray(unmasked), np.asarray(samples, dtype=np.int64)


def shard_local_accuracies(labels: np.ndarray, logits: np.ndarray, shards: Sequence[np.ndarray],
                           label_split: Sequence[Sequence[int]]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every client's local accuracy as HeteroFL and FedRolex score it (``train_classifier_fed.py::test``,
    ``main_resnet.py::test``): on its own test shard, the global model's logits with every label outside the
    client's label split set to 0 (``ResNet.forward``'s ``masked_fill(label_mask == 0, 0)``), top-1 over all C.

    Args:
        labels, logits: the global model on the scored test samples, int (S,) and float (S, C).
        shards: per client, the positions of its own test shard among those S samples.
        label_split: per client, the labels it holds.

    Returns:
        (masked accuracy, unmasked accuracy, test samples scored) per client, float64, float64, int64 (NaN for an
        empty shard); the sources' figure is the mean weighted by samples, :func:`weighted_mean`.
    """
    labels = np.asarray(labels, dtype=np.int64)
    logits = np.asarray(logits)
    masked, unmasked, samples = [], [], []
    for shard, held in zip(shards, label_split):
        shard = np.asarray(shard, dtype=np.int64)
        scores, y = logits[shard], labels[shard]
        keep = np.zeros(logits.shape[1], dtype=bool)
        keep[np.asarray(list(held), dtype=np.int64)] = True
        zero_filled = np.where(keep[None, :], scores, np.zeros((), dtype=scores.dtype))
        finite = ~np.isnan(scores[np.arange(len(shard)), y])  # a NaN label logit is never right
        samples.append(len(shard))
        masked.append(float(((zero_filled.argmax(axis=1) == y) & finite).mean()) if len(shard) else float("nan"))
        unmasked.append(float(((scores.argmax(axis=1) == y) & finite).mean()) if len(shard) else float("nan"))
    return np.asarray(masked), np.asarray(unmasked), np.asarray(samples, dtype=np.int64)


def weighted_mean(accuracies: np.ndarray, samples: np.ndarray) -> Optional[float]:
    """The sources' local accuracy: clients' accuracies weighted by their test samples (all correct over all
    scored), None when no client has one."""
    accuracies, samples = np.asarray(accuracies, dtype=np.float64), np.asarray(samples, dtype=np.float64)
    scored = samples > 0
    return float((accuracies[scored] * samples[scored]).sum() / samples[scored].sum()) if scored.any() else None


def accuracy_summary(accuracies: np.ndarray, tiers: np.ndarray, width: str, masked: bool) -> Dict[str, object]:
    """summary.json's ``local_accuracy`` (``masked``) or ``local_accuracy_unmasked``: mean, worst, 10th
    percentile (numpy's linear interpolation), median and best over the clients with at least one test sample
    of their labels (``clients``), and the mean per capacity tier p^max (``per_tier``)."""
    accuracies = np.asarray(accuracies, dtype=np.float64)
    scored = ~np.isnan(accuracies)
    values = accuracies[scored]
    tiers = np.asarray(tiers, dtype=np.float64)
    if not len(values):
        stats: Dict[str, object] = {k: None for k in ("mean", "worst", "p10", "median", "best")}
    else:
        stats = {"mean": float(values.mean()), "worst": float(values.min()),
                 "p10": float(np.percentile(values, 10)), "median": float(np.median(values)),
                 "best": float(values.max())}
    stats["per_tier"] = {width_key(t): float(accuracies[scored & (tiers == t)].mean())
                         for t in np.unique(tiers).tolist() if np.any(scored & (tiers == t))}
    stats.update(clients=int(scored.sum()), width=width, masked=masked)
    return stats


def check_submodel(params: Optional[Mapping[str, torch.Tensor]], shapes: Mapping[str, Sequence[int]]) -> None:
    """Raise ValueError unless ``params`` holds exactly the parameters ``shapes`` names, each a finite floating
    tensor of that shape (what ``Algorithm.submodel_for_eval`` must return)."""
    if not isinstance(params, Mapping) or set(params) != set(shapes):
        raise ValueError(f"a mapping of the {len(shapes)} parameter names to tensors")
    for name, shape in shapes.items():
        tensor = params[name]
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() or \
                tuple(tensor.shape) != tuple(shape) or not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"parameter {name!r} as a finite float tensor of shape {tuple(shape)}")
