"""FedGMR (Ma et al., ICML 2026) as a run: gradual model restoration over FIARSE's importance masks, in rounds and in
the asynchronous mode. Its rules are :mod:`hasfl_ray.algorithms.league.fedgmr`'s STAND-INS (the authors' code and
the paper's method section could not be read): every run's summary.json says so (``source_status``).

- A client's initial density d_0 is its model size (``fedgmr_size: square``: its width squared, the FIARSE pack's
  ladder; ``width``: its width); in round t its density is ``fedgmr.density(t, d_0)`` (linear steps up to
  ``fedgmr_final_density`` by ``fedgmr_restore_rounds``).
- Its mask persists across rounds and only grows: each time it is handed out, ``fedgmr.restore_mask`` adds the
  highest-|w^t| scored coordinates it lacks (FIARSE's importance, over every scored tensor of the network at once)
  up to the density; the norms travel whole. The masks are the algorithm's state (a resumed run continues them).
- The client trains w ⊙ m (gradient g ⊙ m) and uploads its held coordinates; the server takes the mask-aware mean
  over the clients holding each coordinate, weights n_i (× s(τ) in the asynchronous mode, which its server applies).
- Evaluation at width p: the global model masked at p's size (FIARSE's rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

import torch

from hasfl_ray.algorithms.fiarse import FIARSE, SIZE_RULES
from hasfl_ray.algorithms.league import fedgmr as rules
from hasfl_ray.aggregation.packed import pack_bits, unpack_bits
from hasfl_ray.errors import ConfigError
from hasfl_ray.registry import register_algorithm
from hasfl_ray.training.local import LocalObjective


@dataclass
class FedGMRRunOptions(rules.FedGMROptions):
    fedgmr_size: str = "square"  # square: initial density = width^2 (the pack's ladder); width: the width itself

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fedgmr_size not in SIZE_RULES:
            raise ConfigError(f"fedgmr_size is {self.fedgmr_size!r}; expected square (a client's initial density is "
                              "its width squared) or width (its width)")


@register_algorithm("fedgmr")
class FedGMR(FIARSE):
    """FedGMR over FIARSE's masks: see the module docstring."""

    name = "fedgmr"
    options_class = FedGMRRunOptions
    source_status = rules.SOURCE_STATUS
    size_option = "fedgmr_size"

    def __init__(self, config, p_max, num_samples):
        super().__init__(config, p_max, num_samples)
        #: client -> (the round its mask was last handed out, its scored mask packed flat over scored_names())
        self.client_masks: Dict[int, Tuple[int, torch.Tensor]] = {}

    def size(self, width: float) -> float:
        return float(width) ** 2 if self.options.fedgmr_size == "square" else float(width)

    def parameter_masks(self, round: int, client: int, width: float) -> Dict[str, torch.Tensor]:
        names = self.scored()
        self._round_limits(round, width)  # the round's global model
        params = self._params
        numel = sum(params[n].numel() for n in names)
        held = self.client_masks.get(client)
        if held is not None and held[0] == round:
            flat = unpack_bits(held[1], (numel,))
        else:
            previous = unpack_bits(held[1], (numel,)) if held is not None else torch.zeros(numel, dtype=torch.bool)
            density = rules.density(round, self.size(width), self.options)
            scores = torch.cat([params[n].abs().reshape(-1) for n in names])
            flat = rules.restore_mask(previous, scores, density, "the scored parameters")
            self.client_masks[client] = (round, pack_bits(flat))
        scored, start = {}, 0
        for name in names:
            count = params[name].numel()
            scored[name] = flat[start:start + count].reshape(params[name].shape)
            start += count
        return {name: scored[name] if name in scored else torch.ones(tensor.shape, dtype=torch.bool)  # norms whole
                for name, tensor in params.items()}

    def objective(self, round: int, client: int, width: float) -> LocalObjective:
        return LocalObjective()  # w ⊙ m with the gradient g ⊙ m (the trainer's masked training)

    fixed_config: Dict[str, Any] = {}  # aggregation_weights as given (FIARSE's count mean is not its)

    def aggregation_weights(self, clients):
        return super(FIARSE, self).aggregation_weights(clients)  # n_i (the stand-in's mask-aware mean)

    def state_dict(self) -> Dict[str, Any]:
        state = super().state_dict()
        state["client_masks"] = {str(c): {"round": r, "bits": bits.clone()} for c, (r, bits) in
                                 sorted(self.client_masks.items())}
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.client_masks = {int(c): (int(v["round"]), v["bits"].clone())
                             for c, v in state.get("client_masks", {}).items()}


__all__ = ["FedGMR", "FedGMRRunOptions"]
