"""The run's seeded draws: each round's participants, every client's p^max (the tiers, or each round's) and w^(0)."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from hasfl_ray.data import assign_tiers
from hasfl_ray.federation import WidthLadder
from hasfl_ray.models import build_model
from hasfl_ray.training.seeding import (STREAM_INIT, STREAM_TIERS, STREAM_WIDTHS, numpy_rng,  # noqa: F401
                                       poisson_participants, sample_participants, stream_seed)


def round_participants(algorithm, config, round: int) -> List[int]:
    """Round ``round``'s participants where the engine draws them (no device clock, or one that invites as a run
    without it): the algorithm's ``select`` over every client (default: :func:`sample_participants`, the seeded
    uniform draw), or with ``participation: poisson`` each client independently at rate clients_per_round / clients
    (:func:`poisson_participants`; the algorithm's ``select`` is not asked: its k distinct clients are not a Poisson
    sample); the one place both the round and clients.csv's recount ask."""
    if getattr(config, "participation", "fixed") == "poisson":
        return poisson_participants(config.seed, round, config.clients, config.clients_per_round)
    return algorithm.select(round, range(config.clients), config.clients_per_round)


def check_participation(algorithm, config) -> None:
    """``participation: poisson`` draws the participants itself: refused, in one sentence, with an algorithm whose
    ``select`` chooses them (a plug-in's choice would be ignored otherwise)."""
    from hasfl_ray.errors import ConfigError

    inner = getattr(algorithm, "algorithm", algorithm)  # GuardedAlgorithm keeps the instance as .algorithm
    if getattr(config, "participation", "fixed") == "poisson" and \
            not getattr(getattr(type(inner), "select", None), "seeded_uniform", False):
        raise ConfigError(f"participation is 'poisson' but algorithm {getattr(algorithm, 'label', config.algorithm)!r} "
                          "chooses its own participants (select); expected participation fixed with it")


def capacity_tiers(seed: int, num_clients: int, counts: Optional[Sequence[int]] = None,
                   ladder: Optional[WidthLadder] = None) -> np.ndarray:
    """p_i^max of every client: the run's tier draw from rng(seed, tiers) (``hasfl-ray data inspect`` shares it);
    ``counts`` clients per tier (config ``tier_counts``), default the text's mix (8/5/4/3 of 20), of the width
    ``ladder`` (default the paper's tiers; :func:`hasfl_ray.federation.ladder_of` a config's)."""
    ladder = ladder or WidthLadder()
    return assign_tiers(num_clients, numpy_rng(seed, STREAM_TIERS), ladder.widths, ladder.probabilities,
                        counts=counts)


def round_capacities(seed: int, round: int, num_clients: int, ladder: WidthLadder) -> np.ndarray:
    """``width_assignment: dynamic``: every client's p^max for round ``round``, drawn independently from the
    ladder's mix with rng(seed, widths, round) (HeteroFL's "dynamic"), the same on every backend and after a
    resume."""
    return ladder.draw(num_clients, numpy_rng(seed, STREAM_WIDTHS, round))


def initial_parameters(model_name: str, seed: int) -> Dict[str, torch.Tensor]:
    """w^(0): the full-width model initialised from the run seed (the global torch RNG is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stream_seed(seed, STREAM_INIT))
        model = build_model(model_name)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def sub_models(algorithm, round: int, widths: Dict[int, float]) -> Dict[int, Tuple[float, Optional[int]]]:
    """Per client of ``widths`` (its allocation), the (width, depth) of the sub-model it trains
    (``Algorithm.sub_model``; depth None: the whole network's width-p slice), checked: a width in (0, 1] and a depth
    the run's depth plan has, else one PluginInputError sentence (exit status 2) naming the algorithm (a built-in's
    own ``sub_model``, :meth:`GuardedAlgorithm._trusted <hasfl_ray.engine.guard.GuardedAlgorithm._trusted>`: not
    re-validated)."""
    import numbers

    from hasfl_ray.errors import PluginInputError
    from hasfl_ray.registry import shown

    plan = getattr(algorithm, "depth_plan", None)
    trusted = getattr(algorithm, "_trusted", None)
    out = {}
    if trusted is not None and trusted("sub_model"):  # a built-in's own (GuardedAlgorithm): not re-validated
        for client, width in widths.items():
            shape = algorithm.sub_model(round, client, width)
            out[client] = (float(shape[0]), shape[1])
        return out
    for client, width in widths.items():
        shape = algorithm.sub_model(round, client, width)
        ok = isinstance(shape, tuple) and len(shape) == 2 and isinstance(shape[0], numbers.Real) and \
            not isinstance(shape[0], bool) and 0 < float(shape[0]) <= 1 and (
            (shape[1] is None and plan is None) or (plan is not None and isinstance(shape[1], numbers.Integral)
                                                    and not isinstance(shape[1], bool)
                                                    and 1 <= shape[1] <= plan.num_depths))
        if not ok:  # a sub-model description the run cannot use: bad input, exit status 2
            label = getattr(algorithm, "label", type(algorithm).__name__)
            expected = f"(width in (0, 1], depth 1 to {plan.num_depths})" if plan is not None else \
                "(width in (0, 1], None): a depth needs sub_model depth or width_depth"
            raise PluginInputError(f"algorithm {label!r} returned {shown(shape)} from sub_model(); expected "
                                   f"{expected}")  # (shown: on one line, where a tensor's repr runs over many)
        out[client] = (float(shape[0]), None if shape[1] is None else int(shape[1]))
    return out


def task_objective(algorithm, round: int, client: int, width: float, shape: Tuple[float, Optional[int]]):
    """The objective ``client`` trains with: the algorithm's, except that a depth sub-model trained with the plain
    cross-entropy trains every exit up to its depth (:class:`~hasfl_ray.training.task.ExitsObjective`)."""
    objective = algorithm.objective(round, client, width)
    if shape[1] is None:
        return objective
    from hasfl_ray.training.task import ExitsObjective, LocalObjective

    return ExitsObjective() if type(objective) is LocalObjective else objective


def client_task(algorithm, config, round: int, client: int, width: float, shape: Tuple[float, Optional[int]],
                lr: float, number: Optional[int] = None, **extra):
    """The :class:`~hasfl_ray.training.task.ClientTask` of ``client`` allocated ``width`` and training ``shape``
    ((width, depth), :func:`sub_models`) at ``round`` (the server version in async mode, where ``number`` is the
    dispatch's number that seeds it; the round itself otherwise): the one place both modes ask the algorithm for
    the sub-model's description (window offset, channel sets, masks, depth) and the objective. Channel sets and masks
    are asked at the width the client trains, ``shape[0]`` (a ``sub_model`` may change the allocation), as the device
    clock asks them (:func:`client_price`): sets of the allocation would not fit the trained network, and masks asked
    at two widths would be priced apart from those trained. ``extra``: the mode's own fields (``max_steps``,
    ``proximal``)."""
    from hasfl_ray.training.task import ClientTask

    channels = algorithm.channel_sets(round, client, shape[0])
    objective = task_objective(algorithm, round, client, width, shape)
    offset = algorithm.window_offset(round, client)
    masks = packed_masks(algorithm, round, client, shape[0], shape, channels)
    if channels is not None or masks is not None:
        check_sparse_task(algorithm, config, client, offset, "channel sets" if channels is not None else "masks")
    return ClientTask(client, round if number is None else number, shape[0], lr, config.seed, objective,
                      offset=offset, masked_loss=config.masked_loss, depth=shape[1], channels=channels, masks=masks,
                      **extra)


def check_one_shape(algorithm, sub_model: str, label: str) -> None:
    """A run of depth sub-models (``sub_model`` depth or width_depth) refuses, in one sentence before anything is
    made, an algorithm that hands out channel sets or masks (its class overrides ``channel_sets`` or
    ``parameter_masks``): a client trains one sub-model shape. Asked at the first dispatch instead, such a plug-in
    drawing its channels as examples/channel_policy.py does failed in its own code (the exits are no sequential
    chain, exit status 1) before the check's sentence could be given."""
    from hasfl_ray.algorithms import Algorithm
    from hasfl_ray.errors import ConfigError

    if sub_model == "width":
        return
    for method, what in (("channel_sets", "channel sets"), ("parameter_masks", "masks")):
        own = getattr(type(algorithm), method, None)
        if own is not None and own is not getattr(Algorithm, method):
            raise ConfigError(f"algorithm {label!r} hands out {what} ({method}) but sub_model is {sub_model!r}; "
                              f"expected sub_model width (a client trains one sub-model shape: {what} of the whole "
                              "network at width, or a depth)")


def check_sparse_task(algorithm, config, client: int, offset: int, what: str) -> None:
    """A client handed channel sets or masks (``what``) is refused, before it trains, in one sentence (exit status 2)
    where the server could not aggregate its update: beside a rolling-window offset, a label split or the
    common-core estimator (``Server._aggregate``); a built-in refuses the config itself before anything runs."""
    from hasfl_ray.config.sparse_mix import sparse_config_conflict
    from hasfl_ray.errors import PluginInputError

    label = getattr(algorithm, "label", type(algorithm).__name__)
    conflict = sparse_config_conflict(config)
    if offset:
        problem, expected = f"with window offset {offset}", "offset 0 (rolling windows are of leading slices)"
    elif conflict is not None:
        problem, expected = f"and {conflict[0]} is {conflict[1]!r}", f"{conflict[0]} {conflict[2]}"
    else:
        return
    raise PluginInputError(f"algorithm {label!r} handed client {client} {what} {problem}, which the server cannot "
                           f"aggregate together; expected {expected}")


def packed_masks(algorithm, round: int, client: int, width: float, shape: Tuple[float, Optional[int]],
                 channels) -> Optional[Tuple[Tuple[str, "torch.Tensor"], ...]]:
    """The client's ``Algorithm.parameter_masks`` as (name, bitmask) pairs (what travels), None without; a mask
    beside channel sets or a depth is refused in one sentence."""
    from hasfl_ray.aggregation.packed import pack_bits
    from hasfl_ray.errors import PluginInputError

    masks = algorithm.parameter_masks(round, client, width) if hasattr(algorithm, "parameter_masks") else None
    if masks is None:
        return None
    if channels is not None or shape[1] is not None:
        raise PluginInputError(f"algorithm {getattr(algorithm, 'label', type(algorithm).__name__)!r} handed client "
                               f"{client} masks together with {'channel sets' if channels is not None else 'a depth'}; "
                               "expected one sub-model shape per client (masks train the full-shape network)")
    return tuple((name, pack_bits(mask)) for name, mask in masks.items())


def client_price(algorithm, clock, round: int, client: int, shape: Tuple[float, Optional[int]]):
    """The :class:`~hasfl_ray.clock.cost.ClientCost` of ``client`` training ``shape`` on the run's ``clock``: its
    base cost (a masked client's: held values and bitmasks each way, the full network's MACs) and the algorithm's
    extras (``Algorithm.client_cost``)."""
    masks = algorithm.parameter_masks(round, client, shape[0]) if hasattr(algorithm, "parameter_masks") else None
    held = None if masks is None else {name: int(mask.sum()) for name, mask in masks.items()}
    return algorithm.client_cost(round, client, shape[0], clock.base_cost(client, *shape, held=held))
