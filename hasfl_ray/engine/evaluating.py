"""Evaluation planning: which widths a round evaluates and when, plug-in sub-models, the local-accuracy pass."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from hasfl_ray.data.base import TextFederatedDataset
from hasfl_ray.engine.guard import GuardedAlgorithm, PluginError
from hasfl_ray.evaluation import (accuracy_summary, default_eval_widths, is_eval_round, local_accuracies,
                                  shard_local_accuracies, submodel_groups, weighted_mean, width_key)
from hasfl_ray.models import build_model
from hasfl_ray.registry import call_plugin, spec_label

#: summary.json's local_accuracy on a text dataset (docs/metrics.md).
TEXT_LOCAL_ACCURACY = ("not defined for this dataset: a text client's labels are the next characters of its text, "
                       "which cover nearly the whole vocabulary, so restricting the logits to them is not a label "
                       "skew to measure")
#: summary.json's local_accuracy under local_eval_rule source where the partition deals no test shards.
NO_SHARDS_LOCAL_ACCURACY = ("not defined for this partition: the sources' rule (local_eval_rule source) scores each "
                            "client on its own test shard, which only classes:K deals (HeteroFL's and FedRolex's "
                            "non-IID split; their IID rows report global accuracy only)")


def eval_widths(engine: Any) -> List[float]:
    """The widths evaluated on evaluation rounds, ascending, 1.0 last (``eval_widths``, else the tiers' p^max;
    with dynamic assignment every width of the ladder)."""
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
    full = engine.backend.request("evaluate")
    at_widths = local = None
    if is_eval_round(t, c.rounds, c.eval_every):
        all_widths = list(engine.eval_widths)
        widths = [w for w in all_widths if w != 1.0]
        at_widths = (all_widths, engine.backend.request("evaluate_widths", widths, submodels(engine, widths))
                     if widths else (lambda: {}))
    if is_eval_round(t, c.rounds, c.local_eval_every):
        local = engine.request_local_accuracy()

    parts = [full] + ([at_widths[1]] if at_widths is not None else []) + ([local] if local is not None else [])

    def finish() -> Tuple[float, float, Dict[str, Any]]:
        accuracy, loss = full()
        out: Dict[str, Any] = {}
        if at_widths is not None:
            all_widths, requested = at_widths
            results = dict(requested())
            results[1.0] = (accuracy, loss)
            out["accuracy_at_width"] = {width_key(w): results[w][0] for w in all_widths}
            out["loss_at_width"] = {width_key(w): results[w][1] for w in all_widths}
        if local is not None:
            result = local()
            # Lines may be completed out of round order (Ray: the last round's at once, an earlier deferred one
            # after it), so the run's local accuracy (clients.csv, summary.json) is the latest round's, not the
            # last completed.
            if t >= getattr(engine, "_local_round", -1):
                engine.local, engine._local_round = result, t
            if not isinstance(result, str):
                out["local_accuracy_mean"] = result["summary"]["mean"]
        return accuracy, loss, out

    finish.ready = lambda: all(getattr(part, "ready", lambda: True)() for part in parts)
    return finish


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


def request_local_accuracy(engine: Any):
    """:meth:`Engine.local_accuracy`, started now (the widths and tiers are today's), given by the function returned."""
    if isinstance(engine.dataset, TextFederatedDataset):
        return lambda: TEXT_LOCAL_ACCURACY
    c = engine.config
    if c.local_eval_rule == "source":
        return request_shard_local_accuracy(engine)
    if getattr(engine, "_label_counts", None) is None:  # the training partition's label histograms: once a run
        label = f"dataset {spec_label(c.dataset)!r}"
        engine._label_counts = call_plugin(label, "label_histograms",
                                           lambda: np.asarray(engine.dataset.label_histograms(), dtype=np.int64))
        if engine._label_counts.ndim != 2 or engine._label_counts.shape[0] != c.clients:
            raise PluginError(f"{label} returned label histograms of shape {engine._label_counts.shape} from "
                              f"label_histograms(); expected (clients, classes) = ({c.clients}, classes)")
    widths = np.array(engine.algorithm.p_current if c.local_eval_width == "final" else engine.p_max,
                      dtype=np.float64)
    p_max, label_counts = np.array(engine.p_max, dtype=np.float64), engine._label_counts
    specs = build_model(engine.model_name).param_specs()
    chosen, groups = submodel_groups(widths, lambda w: tuple(s.sliced_shape(w) for s in specs.values()))
    requested = engine.backend.request("test_beats", chosen, submodels(engine, chosen))

    def finish() -> Dict[str, Any]:
        labels, beats = requested()
        masked, unmasked, samples = local_accuracies(labels, np.stack([beats[w] for w in chosen]), groups,
                                                     label_counts)
        return {"masked": masked, "unmasked": unmasked, "samples": samples, "widths": widths,
                "summary": accuracy_summary(masked, p_max, c.local_eval_width, True),
                "summary_unmasked": accuracy_summary(unmasked, p_max, c.local_eval_width, False)}

    finish.ready = getattr(requested, "ready", lambda: True)
    return finish


def evaluation_summary(engine: Any) -> Dict[str, Any]:
    """summary.json's accuracy at each width (the last evaluation's and the best over the run's evaluations)
    and local accuracy (computed here when the last round's was not: a resumed run that had finished)."""
    out: Dict[str, Any] = {}
    evaluated = [line["accuracy_at_width"] for line in engine.history if "accuracy_at_width" in line]
    if evaluated:
        out["accuracy_at_width_final"] = dict(evaluated[-1])
        out["accuracy_at_width_best"] = {k: max(e[k] for e in evaluated if k in e) for k in evaluated[-1]}
    if engine.local is None:
        engine.local = engine.local_accuracy()
    if isinstance(engine.local, str):
        out["local_accuracy"] = out["local_accuracy_unmasked"] = engine.local
    else:
        out["local_accuracy"], out["local_accuracy_unmasked"] = engine.local["summary"], \
            engine.local["summary_unmasked"]
    return out


def request_shard_local_accuracy(engine: Any):
    """Local accuracy as HeteroFL and FedRolex score it (``local_eval_rule: source``; docs/metrics.md): every client
    on its own test shard (classes:K), the global model at the global width 1, logits outside the client's label
    split set to 0, and summary.json's mean weighted by samples over all clients. Started now; the function
    returned gives it."""
    shards = getattr(engine.dataset, "client_test_indices", None)
    label_split = getattr(engine.dataset, "label_split", None)
    if shards is None or label_split is None:
        return lambda: NO_SHARDS_LOCAL_ACCURACY
    shards = [np.asarray(ix, dtype=np.int64) for ix in shards]
    scored = np.unique(np.concatenate(shards)) if shards else np.zeros(0, dtype=np.int64)
    positions = [np.searchsorted(scored, shard) for shard in shards]
    p_max = np.array(engine.p_max, dtype=np.float64)
    requested = engine.backend.request("test_logits", scored, 1.0)

    def finish() -> Dict[str, Any]:
        labels, logits = requested()
        masked, unmasked, samples = shard_local_accuracies(labels, logits, positions, label_split)
        summaries = []
        for values, is_masked in ((masked, True), (unmasked, False)):
            summary = accuracy_summary(values, p_max, "global", is_masked)
            summary.update(mean_over_clients=summary["mean"], mean=weighted_mean(values, samples), rule="source",
                           weighted=True)
            summaries.append(summary)
        return {"masked": masked, "unmasked": unmasked, "samples": samples,
                "widths": np.ones(len(shards), dtype=np.float64), "summary": summaries[0],
                "summary_unmasked": summaries[1]}

    finish.ready = getattr(requested, "ready", lambda: True)
    return finish
