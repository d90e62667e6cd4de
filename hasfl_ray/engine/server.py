"""The server: holds the global parameters, aggregates packed updates, applies w ← w + η_g Δ̄, evaluates."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from hasfl_ray.aggregation import AggregateResult, aggregate_updates
from hasfl_ray.aggregation.server_optim import ServerOptimizer, as_state, server_update
from hasfl_ray.aggregation.packed import SPARSE_TYPES, gather_like, to_device, with_values
from hasfl_ray.aggregation.common_core import common_core_divergence
from hasfl_ray.aggregation.label_split import aggregate_label_split, output_layer
from hasfl_ray.aggregation.windows import aggregate_windows
from hasfl_ray.data.base import FederatedDataset
from hasfl_ray.engine import shard_logits
from hasfl_ray.errors import ConfigError, RunError
from hasfl_ray.evaluation import beats, pack_bits
from hasfl_ray.models import build_model, extract, gate_blocks_of, register_model
from hasfl_ray.engine.depth_eval import evaluate_depths, shape_model, shape_width
from hasfl_ray.engine.layer_coverage import layer_coverage  # noqa: F401 (importable here)
from hasfl_ray.engine import eval_layout
from hasfl_ray.engine.eval_layout import _evaluation_layout  # noqa: F401 (tests import it from here)
from hasfl_ray.engine.server_privacy import covered_everywhere, private_mean
from hasfl_ray.engine.statistics import StatisticsPlan, pass_batches, statistics_plan  # noqa: F401 (importable here)
from hasfl_ray.models.resnet import sbn_statistics
from hasfl_ray.models.slicing import ParamSpec, region, window_indices, window_linear_index
from hasfl_ray.ops.sparse import has_sparse
from hasfl_ray.training.evaluate import evaluate
from hasfl_ray.training.local import ClientResult
from hasfl_ray.training.result import finite_flags

logger = logging.getLogger(__name__)


class NonFiniteModelError(RunError):
    """Applying a round's aggregate would put NaN or infinity into the global model (which is left unchanged)."""


def params_sha256(params: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over the parameters in name order (names, shapes and raw float32 bytes)."""
    digest = hashlib.sha256()
    for name in sorted(params):
        tensor = params[name].detach().to("cpu", torch.float32).contiguous()
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


class Server:
    """Global model state and the server half of a round; plain Python (a Ray actor wraps it as is).

    Args:
        model_name: key of the model in :data:`hasfl_ray.models.MODEL_CONFIGS`.
        initial_params: name -> full-shape float32 tensor w^(0).
        dataset: used for its test set only (the server keeps :meth:`FederatedDataset.test_view`).
        eval_batch_size: evaluation batch size (part of the BN policy).
        aggregation_backend: ``auto``, ``fused`` or ``reference``.
        device: where the global parameters live and aggregation/evaluation run.
        eval_indices: sorted test-set positions to evaluate on (``eval_samples``,
            :func:`~hasfl_ray.training.evaluate.evaluation_subset`); None for the whole test set.
        estimator: ``masked`` (the divergence norms over each client's own coordinates, from the kernel) or
            ``common-core`` (over the coordinates every accepted participant covers,
            :func:`~hasfl_ray.aggregation.common_core.common_core_divergence`).
        label_masks: per client, the labels it holds, bool (clients, classes): the output layer is aggregated by
            label split (``classifier_aggregation: label_split``, :mod:`hasfl_ray.aggregation.label_split`); None:
            over every covering client.
    """

    def __init__(self, model_name: str, initial_params: Mapping[str, torch.Tensor], dataset: FederatedDataset,
                 eval_batch_size: int = 500, aggregation_backend: str = "auto", device: str = "cpu",
                 eval_indices: Optional[torch.Tensor] = None, estimator: str = "masked",
                 statistics: Optional[Sequence] = None, label_masks: Optional[np.ndarray] = None):
        self.device = torch.device(device)
        # sBN's evaluation statistics (a StatisticsPlan, or its first three fields); None: in order, eval batches
        self.statistics = StatisticsPlan(*statistics) if statistics is not None else \
            StatisticsPlan("in_order", eval_batch_size, 0)
        register_model(model_name, getattr(dataset, "model_config", None))  # a dataset plug-in's own model
        self.model = eval_layout.full_width_layout(build_model(model_name).to(self.device))
        self.model_name = model_name
        self._width_models: Dict[float, nn.Module] = {1.0: self.model}  # sub-models evaluated at each width
        self.specs = self.model.param_specs()
        self.shapes = {name: spec.shape for name, spec in self.specs.items()}
        self.gate_blocks = gate_blocks_of(self.specs)
        self.params = {name: initial_params[name].detach().to(self.device, torch.float32).clone()
                       for name in self.specs}
        self.initial = {name: t.clone() for name, t in self.params.items()}
        self.dataset = dataset.test_view().to(self.device)
        self.eval_batch_size, self.aggregation_backend = eval_batch_size, aggregation_backend
        self.eval_indices = None if eval_indices is None else torch.as_tensor(eval_indices, dtype=torch.int64)
        self.estimator = estimator
        self.label_masks = None if label_masks is None else np.asarray(label_masks, dtype=bool)
        self.output_layer = () if label_masks is None else output_layer(self.specs, self.label_masks.shape[1])
        self._frozen_counts: Optional[Dict[str, int]] = None  # per parameter, of the current params (None: stale)
        self._calibrated: Dict[float, nn.Module] = {}  # sBN: the width models whose statistics fit the current params
        #: per cached width model, the labels and packed beats of its last test pass on the current params: the
        #: local-accuracy pass (test_beats) reuses them instead of a second forward over the test set
        self._beats: Dict[Any, Tuple[np.ndarray, np.ndarray]] = {}
        #: FedAsync (docs/async.md): model versions clients in flight started from, version -> [params, holders]
        self._versions: Dict[int, list] = {}
        #: the server optimiser's state (aggregation/server_optim.py: FedAvgM's or FedBuff's momentum "m", the adaptive
        #: optimisers' "m" and "v"), name -> full shape (None: no step yet, or an optimiser without state)
        self.momentum: Optional[Dict[str, Dict[str, torch.Tensor]]] = None
        self.privacy = self.privacy_keys = None  # differential privacy (set_privacy), off by default

    def get_params(self) -> Dict[str, torch.Tensor]:
        return {name: t.detach().cpu().clone() for name, t in self.params.items()}

    def set_params(self, params: Mapping[str, torch.Tensor]) -> None:
        self._frozen_counts = None
        self._calibrated.clear()
        self._beats.clear()
        for name, tensor in params.items():
            self.params[name].copy_(tensor)

    def keep_version(self, version: int) -> None:
        """Keep the current parameters as model ``version`` while a client in flight started from it (FedAsync mixes
        the client's model w_stale + Δ_i, so the server needs w_stale at the client's coordinates); one holder more
        when it is kept already."""
        if version in self._versions:
            self._versions[version][1] += 1
        else:
            self._versions[version] = [{name: t.clone() for name, t in self.params.items()}, 1]

    def release_version(self, version: int) -> None:
        """One holder of ``version`` fewer; the copy is dropped with the last."""
        kept = self._versions.get(version)
        if kept is not None:
            kept[1] -= 1
            if kept[1] <= 0:
                del self._versions[version]

    def kept_versions(self) -> Dict[int, Tuple[Dict[str, torch.Tensor], int]]:
        """The versions kept and their holders (a checkpoint's), version -> (CPU params, holders)."""
        return {v: ({n: t.detach().cpu().clone() for n, t in kept[0].items()}, kept[1])
                for v, kept in self._versions.items()}

    def restore_versions(self, versions: Mapping[int, Tuple[Mapping[str, torch.Tensor], int]]) -> None:
        self._versions = {int(v): [{n: t.to(self.device, torch.float32).clone() for n, t in params.items()},
                                   int(holders)] for v, (params, holders) in versions.items()}

    def mixed(self, results: Sequence[ClientResult], bases: Sequence[Optional[int]]) -> List[ClientResult]:
        """FedAsync's mixing as updates: each result's update u_i = (w_stale + Δ_i) − w at its own coordinates (its
        packed slice or window), w_stale the kept version ``bases[i]`` (None: the current model, u_i = Δ_i), so
        that w + α u_i = (1 − α) w + α (w_stale + Δ_i) there."""
        out = []
        for result, base in zip(results, bases):
            if base is None:
                out.append(result)
                continue
            stale = self._versions[base][0]
            update = {}
            for name, delta in result.update.items():
                spec = self.specs[name]
                if isinstance(delta, SPARSE_TYPES):  # an index set or mask: the gap at its own coordinates
                    gap = gather_like(delta, stale[name]) - gather_like(delta, self.params[name])
                    update[name] = with_values(delta, (delta.values.to(self.device) + gap.to(delta.dtype)).contiguous())
                    continue
                shape = tuple(delta.shape)
                if result.offset:
                    index = window_linear_index(spec, shape, result.offset, self.device)
                    gap = stale[name].reshape(-1)[index] - self.params[name].reshape(-1)[index]
                else:
                    gap = region(stale[name], shape, spec.gate_blocks).reshape(shape) - \
                        region(self.params[name], shape, spec.gate_blocks).reshape(shape)
                update[name] = (delta.to(self.device) + gap.to(delta.dtype)).contiguous()
            out.append(dataclasses.replace(result, update=update))
        return out

    def momentum_state(self) -> Optional[Dict[str, Dict[str, torch.Tensor]]]:
        """The server optimiser's state, {"m": ..., "v": ...} (CPU copies; a checkpoint's), None before its first
        step."""
        return None if self.momentum is None else {
            key: {n: t.detach().cpu().clone() for n, t in part.items()} for key, part in self.momentum.items()}

    def restore_momentum(self, state: Optional[Mapping[str, Any]]) -> None:
        state = as_state(state)  # (a FedBuff checkpoint's flat momentum buffer too)
        self.momentum = None if state is None else {
            key: {n: t.to(self.device, torch.float32).clone() for n, t in part.items()} for key, part in state.items()}

    def apply(self, results: Sequence[ClientResult], weights: Sequence[float],
              server_lr: float = 1.0, bases: Optional[Sequence[Optional[int]]] = None,
              optimizer: Optional[ServerOptimizer] = None,
              keep_updates: bool = False) -> Tuple[List[ClientResult], AggregateResult]:
        """Aggregate the finite results (in the given client order) and update the global parameters.

        A result holding NaN/Inf is rejected and logged; it never reaches the global model. ``bases`` (FedAsync):
        per result, the kept model version it started from, whose mixing :meth:`mixed` turns into its update.
        ``optimizer``: the server optimiser (:mod:`hasfl_ray.aggregation.server_optim`; None: w ← w + η Δ̄), its state
        kept here between calls; ``server_lr`` is its :meth:`~ServerOptimizer.step_lr`.

        Returns:
            The accepted results with ``update`` emptied (kept with ``keep_updates``: Algorithm.inspect_updates),
            and the aggregate's statistics (``delta`` empty).
        """
        if bases is not None:
            results = self.mixed(results, bases)
        accepted, accepted_weights = [], []
        for result, weight, finite in zip(results, weights, finite_flags(results)):
            if finite:
                accepted.append(result)
                accepted_weights.append(weight)
            else:
                logger.warning("client %d returned %s; rejected", result.client, result.non_finite())
        poisson = self.privacy is not None and self.privacy.expected is not None
        if not accepted and not poisson:  # (Poisson participation under DP releases the noise whoever came)
            empty = torch.zeros(0, dtype=torch.float64)
            return [], AggregateResult({}, empty, empty, 0.0, dict.fromkeys(self.specs, 0.0))
        updates = [{name: to_device(t, self.device) for name, t in r.update.items()} for r in accepted]
        offsets = [r.offset for r in accepted]
        holds = None if self.label_masks is None else self.label_masks[[r.client for r in accepted]]
        aggregate = self._aggregate(updates, offsets, accepted_weights, holds) if self.privacy is None else \
            private_mean(self, updates, offsets, holds, [r.client for r in accepted])  # docs/privacy.md
        with torch.no_grad():  # w + η_g Δ̄ for every parameter first: the global model never holds a non-finite value
            covered = covered_everywhere(self) if poisson else \
                (lambda: self._covered(updates, offsets, accepted_weights, holds))
            updated, steps = server_update(optimizer, self.params, aggregate.delta, server_lr, self.momentum, covered)
            broken = [name for name, tensor in updated.items() if not bool(torch.isfinite(tensor).all())]
            if broken:
                raise NonFiniteModelError(f"the round's aggregate would make the global model non-finite (parameter "
                                          f"{broken[0]!r}, server step {server_lr!r}); the model was left as it was")
            self._frozen_counts = None
            self._calibrated.clear()
            self._beats.clear()
            for name, tensor in updated.items():
                self.params[name].copy_(tensor)
            if steps is not None:  # kept only once the step is accepted
                self.momentum = steps
        div_num, div_den = aggregate.div_num, aggregate.div_den
        if self.estimator == "common-core" and updates:  # (none: a Poisson round under DP nobody joined)
            div_num, div_den = common_core_divergence(self.specs, updates, offsets, aggregate.delta)
        stripped = list(accepted) if keep_updates else [dataclasses.replace(r, update={}) for r in accepted]
        stats = AggregateResult({}, div_num.cpu(), div_den.cpu(), aggregate.covered_fraction,
                                {**layer_coverage(self.specs, updates, offsets), **aggregate.covered_by_layer})
        if self.privacy is not None:
            stats.privacy = self.privacy_keys
        return stripped, stats

    def _aggregate(self, updates, offsets, weights, holds) -> AggregateResult:
        """The coordinate-wise mean of ``updates``: index sets or masks, label split (``holds``: the clients' label
        rows, HeteroFL's combine), rolling windows or leading slices, each by its own aggregation."""
        if has_sparse(updates):  # index sets or masks: the kernel takes them as they are
            if holds is not None or any(offsets) or self.estimator == "common-core":  # bad input: one sentence
                raise ConfigError("index-set or masked updates cannot be combined with label splits, rolling windows "
                                  "or --estimator common-core in one round; expected leading slices beside them")
            return aggregate_updates(self.shapes, updates, weights, self.gate_blocks, backend=self.aggregation_backend)
        if holds is not None:  # the output layer's rows over their label's holders (HeteroFL's combine)
            return aggregate_label_split(self.specs, updates, offsets, weights, holds, self.output_layer,
                                         backend=self.aggregation_backend)
        if any(offsets):  # rolling windows (FedRolex); leading slices take the kernel directly
            return aggregate_windows(self.specs, updates, offsets, weights, backend=self.aggregation_backend)
        return aggregate_updates(self.shapes, updates, weights, self.gate_blocks, backend=self.aggregation_backend)

    def _covered(self, updates, offsets, weights, holds) -> Dict[str, torch.Tensor]:
        """Name -> bool mask of the coordinates the round's mean covers: the same aggregation of ones (so whatever
        covers a coordinate there covers it here, label splits and windows included)."""
        ones = [{name: with_values(t, torch.ones_like(t.values)) if isinstance(t, SPARSE_TYPES) else
                 torch.ones_like(t) for name, t in update.items()} for update in updates]
        return {name: t != 0 for name, t in self._aggregate(ones, offsets, weights, holds).delta.items()}

    def set_privacy(self, settings) -> None:
        """Differential privacy of every later update (a :class:`~hasfl_ray.aggregation.privacy.PrivacySettings`,
        its count and clip those of the run so far), or None: off."""
        self.privacy = settings

    def evaluate(self) -> Tuple[float, float]:
        """(accuracy, loss) of the full-width global model on the test set (or its ``eval_indices``)."""
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                param.copy_(self.params[name])
        self._statistics(1.0, self.model, own=False)
        return self._scored(1.0, self.model)

    def _scored(self, key: Any, model: nn.Module) -> Tuple[float, float]:
        """(accuracy, loss) of a cached width ``model``'s test pass, whose beats :meth:`test_beats` then reuses."""
        beaten: List[Tuple[torch.Tensor, torch.Tensor]] = []
        result = evaluate(model, self.dataset, self.eval_batch_size, self.eval_indices, beaten)
        if beaten:
            self._beats[key] = (torch.cat([y for y, _ in beaten]).numpy().astype(np.int64),
                                pack_bits(torch.cat([b for _, b in beaten]).numpy()))
        return result

    def width_model(self, width: float, params: Optional[Mapping[str, torch.Tensor]] = None,
                    cache: bool = True) -> nn.Module:
        """A width-``width`` network holding the global model's nested prefix at that width (``params`` instead:
        a plug-in's ``submodel_for_eval``); the networks of ``cache`` calls are built once and reused."""
        # a masked sub-model (full shapes, FIARSE's) is evaluated with the full-shape network
        masked = params is not None and isinstance(width, (int, float)) and width != 1.0 and all(
            tuple(params[n].shape) == spec.shape for n, spec in self.specs.items())
        key = ("masked", width) if masked else width
        model = self._width_models.get(key) or _evaluation_layout(shape_model(self.model_name, 1.0 if masked else width)
                                                                  .to(self.device))
        if cache:
            self._width_models[key] = model
        with torch.no_grad():  # a shape beside widths: (width, depth) or the ensemble (hasfl_ray.engine.depth_eval)
            for name, param in model.named_parameters():
                param.copy_(params[name] if params is not None else extract(self.params[name], self.specs[name],
                                                                            shape_width(width)))
        self._statistics(width, model, own=params is not None or not cache)
        return model

    def _statistics(self, width: float, model: nn.Module, own: bool) -> None:
        """Static BatchNorm (docs/models.md): the width model's running statistics from one pass over the clients'
        training data (:func:`~hasfl_ray.models.resnet.sbn_statistics`), once per global model and width (every time
        for ``own`` parameters); nothing for a model without sBN."""
        if not own and self._calibrated.get(width) is model:
            return
        if self.statistics.mode == "test_batch":  # FedRolex, FIARSE: no pass; each test batch's own statistics
            return
        if sbn_statistics(model, pass_batches(self.dataset, self.statistics)) and not own:
            self._calibrated[width] = model

    def evaluate_widths(self, widths: Sequence[float], submodels: Optional[Mapping[float, Mapping[str, torch.Tensor]]]
                        = None) -> Dict[float, Tuple[float, float]]:
        """(accuracy, loss) of the width-w sub-model for each w of ``widths``, on :meth:`evaluate`'s test samples
        in its batches (``submodels``: a plug-in's own sub-model of a width)."""
        submodels = submodels or {}
        return {w: evaluate(self.width_model(w, submodels[w]), self.dataset, self.eval_batch_size, self.eval_indices)
                if submodels.get(w) is not None else self._scored(w, self.width_model(w)) for w in widths}

    def evaluate_depths(self, depths: Sequence[int]) -> Dict[int, Tuple[float, float]]:
        return evaluate_depths(self, depths)  # (accuracy, loss) at each depth: hasfl_ray.engine.depth_eval

    @torch.no_grad()
    def test_beats(self, widths: Sequence[float], submodels: Optional[Mapping[float, Mapping[str, torch.Tensor]]]
                   = None) -> Tuple[np.ndarray, Dict[float, np.ndarray]]:
        """The labels of :meth:`evaluate`'s test samples, int64 (S,), and for each width's sub-model the packed
        bitmask of the classes that beat each sample's label, uint64 (S, W) (:func:`hasfl_ray.evaluation.beats`):
        one forward pass per width, from which every client's local accuracy follows."""
        submodels = submodels or {}
        labels, packed = None, {}
        for w in widths:
            if submodels.get(w) is None and w in self._beats:  # the test pass evaluate() or evaluate_widths() made
                labels, packed[w] = self._beats[w]
                continue
            model = self.width_model(w, submodels.get(w), cache=w in self._width_models)
            model.eval()
            batches = self.dataset.test_batches(self.eval_batch_size) if self.eval_indices is None else \
                self.dataset.test_subset_batches(self.eval_indices, self.eval_batch_size)
            ys, bits = [], []
            for x, y in batches:
                x, y = x.to(self.device), y.to(self.device)
                bits.append(beats(model(x), y).cpu())
                ys.append(y.cpu())
            packed[w] = pack_bits(torch.cat(bits).numpy())
            labels = torch.cat(ys).numpy().astype(np.int64)
        return (np.zeros(0, dtype=np.int64) if labels is None else labels), packed

    def test_logits(self, indices: np.ndarray, width: float = 1.0,
                    groups: Optional[Sequence[int]] = None) -> Tuple[np.ndarray, np.ndarray]:
        """The labels and the width-``width`` global model's logits of the test samples ``indices``, each client's
        shard apart as the sources score it (:func:`hasfl_ray.engine.shard_logits.test_logits`)."""
        return shard_logits.test_logits(self, indices, width, groups)

    def frozen_counts(self) -> Dict[str, int]:
        """Per parameter, how many of its entries are still bit-identical to w^(0) (computed once per update)."""
        if self._frozen_counts is None:
            self._frozen_counts = {n: int((self.params[n] == self.initial[n]).sum()) for n in self.params}
        return self._frozen_counts

    def frozen_fraction(self) -> float:
        """Fraction of trainable parameters still bit-identical to their initial value."""
        return sum(self.frozen_counts().values()) / sum(t.numel() for t in self.params.values())

    def frozen_by_layer(self) -> Dict[str, float]:
        """Parameter name -> fraction of its entries still bit-identical to their initial value."""
        return {name: count / self.params[name].numel() for name, count in self.frozen_counts().items()}

    def params_sha256(self) -> str:
        return params_sha256(self.params)

