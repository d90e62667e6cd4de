"""Evaluation planning: which widths a round evaluates and when, plug-in sub-models, the local-accuracy pass (over
every client up to ``local_eval_clients``, a seeded sample beyond it, stopped by the first signal; docs/metrics.md)."""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from hasfl_ray.data.base import TextFederatedDataset
from hasfl_ray.engine.depth_eval import ENSEMBLE, eval_shape, shape_width
from hasfl_ray.engine.guard import GuardedAlgorithm, PluginError
from hasfl_ray.errors import EvaluationInterrupted
from hasfl_ray.front_end import option
from hasfl_ray.evaluation import (accuracy_summary, default_eval_widths, evaluation_round, is_eval_round,
                                  local_accuracies, shard_local_accuracies, submodel_groups, weighted_mean, width_key)
from hasfl_ray.models import build_model
from hasfl_ray.registry import call_plugin, spec_label
from hasfl_ray.training.seeding import STREAM_LOCAL_EVAL, numpy_rng

logger = logging.getLogger(__name__)

#: summary.json's local_accuracy on a text dataset (docs/metrics.md).
TEXT_LOCAL_ACCURACY = ("not defined for this dataset: a text client's labels are the next characters of its text, "
                       "which cover nearly the whole vocabulary, so restricting the logits to them is not a label "
                       "skew to measure")
#: summary.json's local_accuracy under local_eval_rule source where the partition deals no test shards.
NO_SHARDS_LOCAL_ACCURACY = ("not defined for this partition: the sources' rule (local_eval_rule source) scores each "
                            "client on its own test shard, which only classes:K deals (HeteroFL's and FedRolex's "
                            "non-IID split; their IID rows report global accuracy only)")
#: summary.json's local_accuracy under local_eval_clients off.
OFF_LOCAL_ACCURACY = "not computed: local_eval_clients is off"
#: Clients a dataset that computes label histograms client by client (it defines ``client_label_histograms(ids)``,
#: as the synthetic one does: docs/plugins.md) is asked at a time; between two chunks the pass asks whether a stop
#: was requested.
LOCAL_CHUNK = 2048


def eval_widths(engine: Any) -> List[float]:
    """The widths evaluated on evaluation rounds, ascending, 1.0 last (``eval_widths``, else the tiers' p^max;
    with dynamic assignment every width of the ladder). With depth sub-models the accuracy at width w is that of the
    sub-model a client allocated w trains (:func:`shaped`): under ``sub_model: depth`` its depth at full width."""
    if engine.config.eval_widths:
        return engine.config.eval_widths
    if engine.config.width_assignment == "dynamic":
        return default_eval_widths(np.asarray(engine.ladder.widths))
    return default_eval_widths(engine.p_max)


def request_evaluation(engine: Any, t: int):
    """Start round ``t``'s evaluation of the global model: test accuracy and loss, accuracy_at_width and
    loss_at_width (on its evaluation rounds; width 1 is test_accuracy itself) and every client's local accuracy
    (on its local-evaluation rounds). Returns a function giving (accuracy, loss, the line's other evaluation
    fields); everything it reads of the run is read now, so it may be called after the next round."""
    c = engine.config
    # the run's rounds: rounds, or t + 1 where the run ends after t (dp_epsilon's stop, decided as the round's DP keys
    # were computed, before this): its last round is evaluated like any last round
    ended = getattr(engine, "stopped_early", None)
    rounds = t + 1 if ended is not None and ended.get("round") == t else c.rounds
    plan = getattr(engine.algorithm, "depth_plan", None)  # depth sub-models: every exit's accuracy too
    ensemble = bool(getattr(engine.algorithm, "global_ensemble", False))  # DepthFL: the mean of the exits' logits
    # test_every (docs/metrics.md): a round that is not a test round evaluates nothing of the global model (no
    # forward pass, no sBN statistics pass); its line holds null, as an asynchronous update's that is not evaluated
    # (test_first, test_last: the first round and each of the last test_last rounds are both kinds of evaluation round)
    tested, widths_too = evaluation_round(t, rounds, getattr(c, "test_every", 1), c.eval_every,
                                          getattr(c, "test_first", False), getattr(c, "test_last", 0),
                                          getattr(c, "test_phase", None))
    full = global_evaluation(engine, ensemble) if tested else untested
    at_widths = at_depths = local = None
    if widths_too:
        all_widths = list(engine.eval_widths)
        widths = [w for w in all_widths if w != 1.0]
        at_widths = (all_widths, shaped(engine.backend.request(
            "evaluate_widths", list(dict.fromkeys(eval_shape(plan, w) for w in widths)),
            None if plan else submodels(engine, widths)),
            plan, widths) if widths else (lambda: {}))
        if plan is not None:  # the deepest exit is test_accuracy, unless that is the ensemble
            depths = list(range(1, plan.num_depths + (1 if ensemble else 0)))
            at_depths = (None if ensemble else plan.num_depths, engine.backend.request("evaluate_depths", depths))
    if is_eval_round(t, rounds, c.local_eval_every):
        try:
            local = engine.request_local_accuracy()
        except EvaluationInterrupted as stop:  # the first signal: the round is recorded without it, the run stops
            engine.local_owed = t  # (and --resume computes it first: settle_owed_local)
            logger.warning("round %d's local-accuracy pass %s; the round is recorded without it and %s "
                           "computes it", t, stop, option("resume"))

    parts = [full] + [at[1] for at in (at_widths, at_depths) if at is not None] + ([local] if local is not None else [])

    def finish() -> Tuple[float, float, Dict[str, Any]]:
        accuracy, loss = full()
        out: Dict[str, Any] = {}
        if at_widths is not None:
            all_widths, requested = at_widths
            results = dict(requested())
            results[1.0] = (accuracy, loss)
            out["accuracy_at_width"] = {width_key(w): results[w][0] for w in all_widths}
            out["loss_at_width"] = {width_key(w): results[w][1] for w in all_widths}
        if at_depths is not None:  # the deepest exit is the full model's output: test_accuracy
            deepest, requested = at_depths
            results = {**requested(), **({} if deepest is None else {deepest: (accuracy, loss)})}
            out["accuracy_at_depth"] = {str(d): results[d][0] for d in sorted(results)}
        if local is not None:
            result = local()
            # Lines may be completed out of round order (Ray: the last round's at once, an earlier deferred one
            # after it), so the run's local accuracy (clients.csv, summary.json) is the latest round's, not the
            # last completed.
            if t >= getattr(engine, "_local_round", -1):
                engine.local, engine._local_round = result, t
            if not isinstance(result, str):
                out["local_accuracy_mean"] = result["summary"]["mean"]
                out["local_accuracy_worst"] = result["summary"]["worst"]  # the league's worst client per round
        return accuracy, loss, out

    finish.ready = lambda: all(getattr(part, "ready", lambda: True)() for part in parts)
    return finish


def untested() -> Tuple[None, None]:
    """A round that ``test_every`` does not evaluate: null test_accuracy and test_loss."""
    return None, None


def global_evaluation(engine: Any, ensemble: bool):
    """Start the evaluation of ``test_accuracy``: the full network's (accuracy, loss), or with ``ensemble`` that of
    the mean of its exits' logits (DepthFL's global prediction, :data:`~hasfl_ray.engine.depth_eval.ENSEMBLE`)."""
    if not ensemble:
        return engine.backend.request("evaluate")
    requested = engine.backend.request("evaluate_widths", [ENSEMBLE])

    def result() -> Tuple[float, float]:
        return requested()[ENSEMBLE]

    result.ready = getattr(requested, "ready", lambda: True)
    return result


def shaped(requested, plan: Any, widths: Sequence[float]):
    """``requested``'s results (keyed by the shapes asked for, :func:`~hasfl_ray.engine.depth_eval.eval_shape`)
    keyed by the allocated ``widths`` they stand for: with depth sub-models the accuracy at width w is that of the
    sub-model a client allocated w trains (its width at its depth, ScaleFL's level; under ``sub_model: depth`` the
    full width at its depth, DepthFL's tier)."""
    def result() -> Dict[float, Any]:
        values = requested()
        return {w: values[eval_shape(plan, w)] for w in widths}

    result.ready = getattr(requested, "ready", lambda: True)
    return result


def submodels(engine: Any, widths: Sequence[float]) -> Optional[Dict[float, Dict[str, torch.Tensor]]]:
    """A plug-in's own sub-models (``Algorithm.submodel_for_eval``) of ``widths`` below 1, where it defines them;
    None: the nested prefix, cut on the server."""
    algorithm = engine.algorithm if isinstance(engine.algorithm, GuardedAlgorithm) else \
        GuardedAlgorithm(engine.algorithm, spec_label(engine.config.algorithm))  # one a caller set unguarded
    if not algorithm.overrides_submodel_for_eval or not any(w != 1.0 for w in widths):
        return None
    params, specs = engine.backend.get_params(), build_model(engine.model_name).param_specs()
    out = {}
    for w in widths:
        if w != 1.0:
            sub = algorithm.submodel_for_eval(params, w, {n: s.sliced_shape(w) for n, s in specs.items()})
            if sub is not None:
                out[w] = sub
    return out or None


def scored_clients(engine: Any) -> Optional[np.ndarray]:
    """The clients a local-accuracy pass scores: None for every client (at most ``local_eval_clients`` clients, or
    ``all``), else a seeded sample of ``local_eval_clients`` of them, ascending, the same at every pass of the run
    and on every backend (``rng(seed, STREAM_LOCAL_EVAL)``)."""
    c = engine.config
    if c.local_eval_clients == "all" or c.clients <= c.local_eval_clients:
        return None
    if getattr(engine, "_local_sample", None) is None:
        engine._local_sample = np.sort(numpy_rng(c.seed, STREAM_LOCAL_EVAL).choice(c.clients, c.local_eval_clients,
                                                                                   replace=False))
    return engine._local_sample


def sample_words(engine: Any, clients: Optional[np.ndarray]) -> str:
    """summary.json's ``sample`` of a local accuracy block: which clients it was computed over."""
    if clients is None:
        return "every client"
    return (f"a seeded sample of {len(clients):,} of the {engine.config.clients:,} clients (local_eval_clients "
            f"{engine.config.local_eval_clients})")


def label_counts(engine: Any, clients: Optional[np.ndarray]) -> np.ndarray:
    """The training label histograms of ``clients`` (None: every client), int64 (clients, classes), once a run. A
    dataset that computes them client by client is asked :data:`LOCAL_CHUNK` clients at a time, and a stop
    requested before a chunk raises :class:`EvaluationInterrupted` (ten million synthetic clients take an hour)."""
    if getattr(engine, "_label_counts", None) is not None:
        return engine._label_counts
    c, dataset = engine.config, engine.dataset
    label = f"dataset {spec_label(c.dataset)!r}"
    if not callable(getattr(dataset, "client_label_histograms", None)):  # all at once: a dataset holding its labels
        counts = call_plugin(label, "label_histograms", lambda: np.asarray(dataset.label_histograms(), dtype=np.int64))
        if counts.ndim != 2 or counts.shape[0] != c.clients:
            raise PluginError(f"{label} returned label histograms of shape {counts.shape} from label_histograms(); "
                              f"expected (clients, classes) = ({c.clients}, classes)")
        counts = counts if clients is None else counts[clients]
    else:
        ids = np.arange(c.clients, dtype=np.int64) if clients is None else clients
        parts = []
        for start in range(0, len(ids), LOCAL_CHUNK):
            if engine.stop_signals.requested():
                raise EvaluationInterrupted(f"stopped after {start:,} of {len(ids):,} clients' label histograms")
            chunk = ids[start:start + LOCAL_CHUNK]
            part = call_plugin(label, "client_label_histograms",
                               lambda: np.asarray(dataset.client_label_histograms(chunk), dtype=np.int64))
            if part.ndim != 2 or part.shape[0] != len(chunk) or (parts and part.shape[1] != parts[0].shape[1]):
                raise PluginError(f"{label} returned label histograms of shape {part.shape} from "
                                  f"client_label_histograms(); expected ({len(chunk)}, classes), one row a client")
            parts.append(part)
        counts = np.concatenate(parts)
    engine._label_counts = counts
    return counts


def settle_owed_local(engine: Any) -> None:
    """On ``--resume``: the local-accuracy pass a stop cut short (:class:`EvaluationInterrupted`), computed now from
    the checkpoint's state (the state of that round's end) and put into its line of the history, where a run never
    interrupted has it; nothing when the last line's pass is not owed."""
    c = engine.config
    line = engine.history[-1] if engine.history else None
    if line is None or "local_accuracy_mean" in line or c.local_eval_clients == "off" or \
            not is_eval_round(line["round"], c.rounds, c.local_eval_every):
        return
    result = engine.local_accuracy()
    engine.local, engine._local_round = result, line["round"]
    if isinstance(result, dict):
        wall_s = line.pop("wall_s")
        line.update(local_accuracy_mean=result["summary"]["mean"], local_accuracy_worst=result["summary"]["worst"],
                    wall_s=wall_s)  # the order complete() gives


def request_local_accuracy(engine: Any):
    """:meth:`Engine.local_accuracy`, started now (the widths and tiers are today's), given by the function returned:
    over :func:`scored_clients` (every client, or a seeded sample), its arrays one entry per client scored
    (``clients``: their ids, None for every client)."""
    c = engine.config
    if c.local_eval_clients == "off":
        return lambda: OFF_LOCAL_ACCURACY
    if isinstance(engine.dataset, TextFederatedDataset):
        return lambda: TEXT_LOCAL_ACCURACY
    clients = scored_clients(engine)
    if c.local_eval_rule == "source":
        return request_shard_local_accuracy(engine, clients)
    held = label_counts(engine, clients)
    every = slice(None) if clients is None else clients
    widths = np.array(engine.algorithm.p_current if c.local_eval_width == "final" else engine.p_max,
                      dtype=np.float64)[every]
    p_max = np.array(engine.p_max, dtype=np.float64)[every]
    specs = build_model(engine.model_name).param_specs()
    plan = getattr(engine.algorithm, "depth_plan", None)  # a depth client: at its own (width, depth)
    chosen, groups = submodel_groups(widths, lambda w: (eval_shape(plan, w), tuple(
        s.sliced_shape(shape_width(eval_shape(plan, w))) for s in specs.values())))
    requested = engine.backend.request("test_beats", [eval_shape(plan, w) for w in chosen],
                                       None if plan else submodels(engine, chosen))

    def finish() -> Dict[str, Any]:
        labels, beats = requested()
        beats = {w: beats[eval_shape(plan, w)] for w in chosen}
        masked, unmasked, samples = local_accuracies(labels, np.stack([beats[w] for w in chosen]), groups,
                                                     held)
        return {"masked": masked, "unmasked": unmasked, "samples": samples, "widths": widths, "clients": clients,
                "summary": _sampled(accuracy_summary(masked, p_max, c.local_eval_width, True), engine, clients),
                "summary_unmasked": _sampled(accuracy_summary(unmasked, p_max, c.local_eval_width, False), engine,
                                             clients)}

    finish.ready = getattr(requested, "ready", lambda: True)
    return finish


def _sampled(summary: Dict[str, Any], engine: Any, clients: Optional[np.ndarray]) -> Dict[str, Any]:
    """A local accuracy block with the clients it was computed over: ``evaluated_clients`` and ``sample``."""
    summary.update(evaluated_clients=engine.config.clients if clients is None else len(clients),
                   sample=sample_words(engine, clients))
    return summary


def evaluation_summary(engine: Any) -> Dict[str, Any]:
    """summary.json's accuracy at each width (and depth, with depth sub-models: the last evaluation's and the best
    over the run's evaluations) and local accuracy (computed here when the last round's was not: a resumed run that
    had finished)."""
    out: Dict[str, Any] = {}
    for kind in ("width", "depth"):  # depth: runs with depth sub-models only
        evaluated = [line[f"accuracy_at_{kind}"] for line in engine.history if f"accuracy_at_{kind}" in line]
        if evaluated:
            out[f"accuracy_at_{kind}_final"] = dict(evaluated[-1])
            out[f"accuracy_at_{kind}_best"] = {k: max(e[k] for e in evaluated if k in e) for k in evaluated[-1]}
    if engine.local is None:
        engine.local = engine.local_accuracy()
    if isinstance(engine.local, str):
        out["local_accuracy"] = out["local_accuracy_unmasked"] = engine.local
    else:
        out["local_accuracy"], out["local_accuracy_unmasked"] = engine.local["summary"], \
            engine.local["summary_unmasked"]
    return out


def request_shard_local_accuracy(engine: Any, clients: Optional[np.ndarray] = None):
    """Local accuracy as HeteroFL and FedRolex score it (``local_eval_rule: source``; docs/metrics.md): every client
    on its own test shard (classes:K), the global model at the global width 1, logits outside the client's label
    split set to 0, and summary.json's mean weighted by samples over all clients. Started now; the function
    returned gives it. ``clients``: the clients scored (None: every client)."""
    shards = getattr(engine.dataset, "client_test_indices", None)
    label_split = getattr(engine.dataset, "label_split", None)
    if shards is None or label_split is None:
        return lambda: NO_SHARDS_LOCAL_ACCURACY
    ids = range(len(shards)) if clients is None else clients.tolist()
    shards = [np.asarray(shards[i], dtype=np.int64) for i in ids]
    label_split = [label_split[i] for i in ids]
    # each client's shard apart, as the sources' per-client loaders (its own batches: with test-batch statistics
    # a batch is normalised over that client's samples only)
    scored = np.concatenate(shards) if shards else np.zeros(0, dtype=np.int64)
    ends = np.cumsum([len(shard) for shard in shards], dtype=np.int64)
    positions = [np.arange(end - len(shard), end) for shard, end in zip(shards, ends)]
    p_max = np.array(engine.p_max, dtype=np.float64)[slice(None) if clients is None else clients]
    requested = engine.backend.request("test_logits", scored, 1.0, [len(shard) for shard in shards])

    def finish() -> Dict[str, Any]:
        labels, logits = requested()
        masked, unmasked, samples = shard_local_accuracies(labels, logits, positions, label_split)
        summaries = []
        for values, is_masked in ((masked, True), (unmasked, False)):
            summary = accuracy_summary(values, p_max, "global", is_masked)
            summary.update(mean_over_clients=summary["mean"], mean=weighted_mean(values, samples), rule="source",
                           weighted=True)
            summaries.append(_sampled(summary, engine, clients))
        return {"masked": masked, "unmasked": unmasked, "samples": samples, "clients": clients,
                "widths": np.ones(len(shards), dtype=np.float64), "summary": summaries[0],
                "summary_unmasked": summaries[1]}

    finish.ready = getattr(requested, "ready", lambda: True)
    return finish
