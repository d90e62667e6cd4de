"""The server: holds the global parameters, aggregates packed updates, applies w ← w + η_g Δ̄, evaluates."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from hasfl_ray.aggregation import AggregateResult, aggregate_updates
from hasfl_ray.aggregation.common_core import common_core_divergence
from hasfl_ray.aggregation.windows import aggregate_windows
from hasfl_ray.data.base import FederatedDataset
from hasfl_ray.errors import RunError
from hasfl_ray.models import build_model, gate_blocks_of, register_model
from hasfl_ray.training.evaluate import evaluate
from hasfl_ray.training.local import ClientResult

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
    """

    def __init__(self, model_name: str, initial_params: Mapping[str, torch.Tensor], dataset: FederatedDataset,
                 eval_batch_size: int = 500, aggregation_backend: str = "auto", device: str = "cpu",
                 eval_indices: Optional[torch.Tensor] = None, estimator: str = "masked"):
        self.device = torch.device(device)
        register_model(model_name, getattr(dataset, "model_config", None))  # a dataset plug-in's own model
        self.model = build_model(model_name).to(self.device)
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

    def get_params(self) -> Dict[str, torch.Tensor]:
        return {name: t.detach().cpu().clone() for name, t in self.params.items()}

    def set_params(self, params: Mapping[str, torch.Tensor]) -> None:
        for name, tensor in params.items():
            self.params[name].copy_(tensor)

    def apply(self, results: Sequence[ClientResult], weights: Sequence[float],
              server_lr: float = 1.0) -> Tuple[List[ClientResult], AggregateResult]:
        """Aggregate the finite results (in the given client order) and update the global parameters.

        A result holding NaN/Inf is rejected and logged; it never reaches the global model.

        Returns:
            The accepted results with ``update`` emptied, and the aggregate's statistics (``delta`` empty).
        """
        accepted, accepted_weights = [], []
        for result, weight in zip(results, weights):
            if result.is_finite():
                accepted.append(result)
                accepted_weights.append(weight)
            else:
                logger.warning("client %d returned a non-finite update (loss %s); rejected", result.client,
                               result.loss)
        if not accepted:
            empty = torch.zeros(0, dtype=torch.float64)
            return [], AggregateResult({}, empty, empty, 0.0)
        updates = [{name: t.to(self.device) for name, t in r.update.items()} for r in accepted]
        offsets = [r.offset for r in accepted]
        if any(offsets):  # rolling windows (FedRolex); leading slices take the kernel directly
            aggregate = aggregate_windows(self.specs, updates, offsets, accepted_weights,
                                          backend=self.aggregation_backend)
        else:
            aggregate = aggregate_updates(self.shapes, updates, accepted_weights, self.gate_blocks,
                                          backend=self.aggregation_backend)
        with torch.no_grad():  # w + η_g Δ̄ for every parameter first: the global model never holds a non-finite value
            updated = {name: self.params[name].add(delta, alpha=server_lr) for name, delta in aggregate.delta.items()}
            broken = [name for name, tensor in updated.items() if not bool(torch.isfinite(tensor).all())]
            if broken:
                raise NonFiniteModelError(f"the round's aggregate would make the global model non-finite (parameter "
                                          f"{broken[0]!r}, server step {server_lr!r}); the model was left as it was")
            for name, tensor in updated.items():
                self.params[name].copy_(tensor)
        div_num, div_den = aggregate.div_num, aggregate.div_den
        if self.estimator == "common-core":
            div_num, div_den = common_core_divergence(self.specs, updates, offsets, aggregate.delta)
        stripped = [dataclasses.replace(r, update={}) for r in accepted]
        stats = AggregateResult({}, div_num.cpu(), div_den.cpu(), aggregate.covered_fraction)
        return stripped, stats

    def evaluate(self) -> Tuple[float, float]:
        """(accuracy, loss) of the full-width global model on the test set (or its ``eval_indices``)."""
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                param.copy_(self.params[name])
        return evaluate(self.model, self.dataset, self.eval_batch_size, self.eval_indices)

    def frozen_fraction(self) -> float:
        """Fraction of trainable parameters still bit-identical to their initial value."""
        frozen = sum(int((self.params[n] == self.initial[n]).sum()) for n in self.params)
        total = sum(t.numel() for t in self.params.values())
        return frozen / total

    def params_sha256(self) -> str:
        return params_sha256(self.params)
