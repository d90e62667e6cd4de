"""The common-core divergence estimator: Ĥ_i over only the coordinates every participant of the round covers.

Section 4 of the paper checks the capacity confound with two variants of the estimator. The masked one,
Ĥ_i = ||m_i ⊙ (Δ_i − Δ̄)||² / (||m_i ⊙ Δ̄||² + ε), is what the aggregation kernel returns with Δ̄. The
common-core one replaces m_i by the intersection of all participants' masks, m_∩ = ∏_k m_k, so every client is
scored on the same coordinates whatever its width (with nested leading slices: the smallest participant's slice).
"""

from __future__ import annotations

from typing import Mapping, Sequence, Tuple

import torch

from hasfl_ray.models.slicing import ParamSpec, window_linear_index


def common_core_divergence(specs: Mapping[str, ParamSpec], updates: Sequence[Mapping[str, torch.Tensor]],
                           offsets: Sequence[int], delta: Mapping[str, torch.Tensor]
                           ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(div_num, div_den)``, float64 (num_clients,): ||m_∩ ⊙ (Δ_i − Δ̄)||² and ||m_∩ ⊙ Δ̄||² per client.

    Args:
        specs: parameter name -> slice description of the full model.
        updates: per client, name -> packed tensor (leading slice, or a window at ``offsets[i]``).
        offsets: per client, the window's first channel (0 for leading slices).
        delta: name -> full-shape aggregate Δ̄ of these updates.
    """
    n = len(updates)
    div_num = torch.zeros(n, dtype=torch.float64)
    div_den = torch.zeros(n, dtype=torch.float64)
    for name, spec in specs.items():
        if any(name not in update for update in updates):
            continue  # a client that did not train this parameter covers none of it: no common core here
        mean = delta[name].reshape(-1).to(torch.float64)
        positions = [window_linear_index(spec, update[name].shape, offset, mean.device).reshape(-1)
                     for update, offset in zip(updates, offsets)]
        count = torch.zeros_like(mean, dtype=torch.int64)
        for flat in positions:
            count.index_add_(0, flat, torch.ones_like(flat))
        core = count == n  # the coordinates every participant covers
        for i, (update, flat) in enumerate(zip(updates, positions)):
            inside = core[flat]
            mean_at = mean[flat[inside]]
            div_num[i] += (update[name].reshape(-1)[inside].to(torch.float64) - mean_at).square().sum().cpu()
            div_den[i] += mean_at.square().sum().cpu()
    return div_num, div_den
