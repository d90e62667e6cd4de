"""The Algorithm interface: decide each participant's width, shape the local objective, act on the aggregate."""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Dict, List, Optional, Sequence, Tuple

import numpy as np

from hasfl_ray.aggregation import AggregateResult
from hasfl_ray.schedule import is_adaptation_round  # noqa: F401  (where plug-ins found it before hasfl_ray.schedule)
from hasfl_ray.training.local import ClientResult, LocalObjective
from hasfl_ray.training.seeding import sample_participants

if TYPE_CHECKING:  # the run configuration sits below the algorithms; only type checkers need its class here
    import torch

    from hasfl_ray.clock.cost import ClientCost

    from hasfl_ray.config import RunConfig


@dataclass(frozen=True)
class Arrival:
    """One client's update as an asynchronous server applies it (docs/async.md), what :meth:`Algorithm.arrived`
    is told: the client, its width, the model version it started from, its staleness τ (server updates applied
    since it was dispatched), the staleness factor s(τ) its weight was scaled by, and the simulated seconds of its
    dispatch and of its arrival."""

    client: int
    width: float
    version: int
    staleness: int
    factor: float
    dispatch_s: float
    arrival_s: float


class Algorithm(ABC):
    """A federated algorithm under the common protocol; the engine calls, every round t:

    1. :meth:`allocate` — width p_i in (0, 1] for each participant (sorted client ids);
    2. :meth:`objective` — the :class:`LocalObjective` each participant trains with;
    3. :meth:`aggregation_weights` — the weights of the coordinate-wise mean (default n_i, or 1 each with
       ``aggregation_weights: count``);
    4. :meth:`observe` — the aggregate's statistics and the clients' results, after w ← w + η_g Δ̄.

    Everything random must come from ``hasfl_ray.training.seeding`` streams keyed by (seed, round, …)
    so that results do not depend on the backend, and all state must round-trip through
    :meth:`state_dict` / :meth:`load_state_dict` for bit-identical resume.

    A plug-in's options are a dataclass named by :attr:`options_class`: ``--algo-opt KEY=VALUE`` and a YAML
    ``algorithm_options:`` mapping fill it (checked against its fields' types, unknown keys refused), and the
    algorithm reads them as ``self.options``. A built-in registers with ``@register_algorithm("name")``.

    Args:
        config: the resolved run config.
        p_max: capacity p_i^max per client, float64 (num_clients,).
        num_samples: n_i per client, int64 (num_clients,).
    """

    name: str = "base"
    #: η_g in w ← w + η_g Δ̄ (1 for every method of the paper).
    server_lr: float = 1.0
    #: The dataclass of this algorithm's own options (None: it takes none); ``self.options`` is an instance.
    options_class: ClassVar[Optional[type]] = None

    def __init__(self, config: "RunConfig", p_max: np.ndarray, num_samples: np.ndarray):
        self.config = config
        given = getattr(config, "algorithm_options", None) or {}
        self.options = self.options_class(**given) if self.options_class is not None else None
        self.p_max = np.asarray(p_max, dtype=np.float64)
        self.num_samples = np.asarray(num_samples, dtype=np.int64)
        self.p_current = self.p_max.copy()

    @classmethod
    def resolve_config(cls, config: "RunConfig") -> Dict[str, Any]:
        """Config fields this algorithm fills in before the run (``RunConfig.resolved``), as a mapping of updates;
        e.g. SCAFFOLD's momentum default. Default: none. A field the user left unset is None here (``momentum``,
        ``lr_decay``, ``sub_model``, ...; their defaults fill after), so a value given, the default's included, is
        told apart: set a field only where it is None, or refuse a value given that the algorithm cannot honour."""
        return {}

    @property
    def num_clients(self) -> int:
        return len(self.p_max)

    def capacity_allocation(self, p_max: np.ndarray) -> np.ndarray:
        """The widths this algorithm gives clients of capacities ``p_max`` before anything adapts them (what
        ``p_current`` starts at). Default: p^max itself (Uniform: min(0.5, p^max); the full-model methods: 1)."""
        return np.asarray(p_max, dtype=np.float64).copy()

    def set_capacities(self, round: int, p_max: np.ndarray) -> None:
        """Dynamic width assignment (``width_assignment: dynamic``, docs/configs.md#width-ladder): the engine calls
        it before :meth:`allocate` of every round with every client's capacity for that round, redrawn from the
        width ladder's mix. Default: ``p_max`` replaces the capacities and ``p_current`` becomes
        :meth:`capacity_allocation` of them. An algorithm that adapts widths overrides it (HAS-FL re-applies its
        allocation rule to the new capacities); what it sets must follow from its state and ``p_max`` alone (a
        resumed run calls it again from the checkpointed state). Never called with ``width_assignment: fixed``."""
        self.p_max = np.asarray(p_max, dtype=np.float64).copy()
        self.p_current = self.capacity_allocation(self.p_max)

    def select(self, round: int, available: Sequence[int], k: int) -> List[int]:
        """Round ``round``'s participants: ``k`` distinct clients of ``available`` (the ids the engine may invite; a
        ``range`` of every client), in any order (the engine sorts them). Default: the run's seeded uniform draw
        without replacement (:func:`~hasfl_ray.training.seeding.sample_participants`), the participants every run
        has always had. A plug-in chooses otherwise (docs/plugins.md, "Client selection"); its choice must follow
        from its config, its state and the arguments alone, since clients.csv's ``sampled`` asks again for the rounds
        run. With a device clock whose availability limits the invitations (docs/clock.md), the clock invites; with
        ``participation: poisson`` the engine draws them itself, and refuses an algorithm that overrides this."""
        return [available[i] for i in sample_participants(self.config.seed, round, len(available), k)]

    select.seeded_uniform = True  # the engine asks this, not the class (participants.check_participation)

    def allocate(self, round: int, participants: Sequence[int]) -> Dict[int, float]:
        """Width of each participant this round. Default: the current allocation (p^max initially)."""
        return {i: float(self.p_current[i]) for i in participants}

    # -- the device clock (docs/clock.md): read by allocation policies, extended by algorithms that move more ------

    #: The run's device clock (:class:`hasfl_ray.clock.Clock`) when a device population is configured, else None;
    #: the engine sets it before the first round. :meth:`device`, :meth:`round_seconds` and ``clock.deadline`` are
    #: what an allocation policy reads to choose widths that meet the deadline.
    clock: Optional[Any] = None
    #: The name of the run's model (``hasfl_ray.models.build_model(model_name)`` builds it at full width); the engine
    #: sets it before the first round (FedRolex's window reads the model's channel counts), None before.
    model_name: Optional[str] = None
    #: ``global_params()`` reads the current global model (name -> full-shape tensor, CPU; the server's version in
    #: an asynchronous run); the engine sets it before the first round (FIARSE's thresholds read it), None before.
    global_params: Optional[Any] = None

    def check_model(self, widths: Sequence[float]) -> None:
        """Refuse, in one sentence (raise :class:`~hasfl_ray.errors.ConfigError`), a run this algorithm cannot train:
        its model (``model_name`` and ``depth_plan`` are set by then) at ``widths`` (every width the run's ladder
        can deal and every evaluation width). The engine calls it once, before anything is written (the run
        directory, the device), so a refusal leaves nothing behind. Default: nothing to refuse."""

    def device(self, client: int) -> Optional[Dict[str, float]]:
        """Client ``client``'s device (speed_macs_per_s, down_bytes_per_s, up_bytes_per_s, latency_s), or None
        without a device population."""
        return self.clock.profile(client) if self.clock is not None else None

    def client_cost(self, round: int, client: int, width: float, cost: "ClientCost") -> "ClientCost":
        """What ``client`` moves and computes in round ``round`` at ``width``: ``cost`` (its sub-model down, its
        update up, its local steps' training MACs) plus whatever this algorithm adds (``cost.plus(...)``: SCAFFOLD's
        control variates, FedProx's proximal term, FjORD's distillation passes). Asked only when a device
        population is configured; must not change the algorithm's state. Default: ``cost``, plus for a client on
        channel sets (:meth:`channel_sets` not None) its index lists each way
        (:func:`hasfl_ray.clock.cost.index_list_bytes`)."""
        if self.channel_sets(round, client, width) is None:
            return cost
        from hasfl_ray.clock.cost import index_list_bytes

        extra = index_list_bytes(self.model_name, width)
        return cost.plus(bytes_down=extra, bytes_up=extra)

    def round_seconds(self, round: int, client: int, width: float) -> Optional[float]:
        """The simulated seconds ``client`` would take in round ``round`` at ``width`` (download, local steps,
        upload and latency on its device, this algorithm's extras included), or None without a device
        population."""
        if self.clock is None:
            return None
        return self.clock.seconds(client, self.client_cost(round, client, width, self.clock.base_cost(client, width)))

    def objective(self, round: int, client: int, width: float) -> LocalObjective:
        """The local objective of ``client``. Default: cross-entropy."""
        return LocalObjective()

    #: The run's :class:`~hasfl_ray.models.depth_plan.DepthPlan` (``sub_model: depth`` or ``width_depth``), set by the
    #: engine before the first round; None: every client trains a width-p slice of the whole network.
    depth_plan: Optional[Any] = None

    def sub_model(self, round: int, client: int, width: float) -> "Tuple[float, Optional[int]]":
        """(width, depth) of the sub-model ``client`` trains when allocated ``width``: by default ``(width, None)``,
        or with a depth plan its depth on the run's ladder, at full width (``depth``) or at ``width``
        (``width_depth``). An allocation policy may override it to hand out depths its own way (depths from 1 to
        ``depth_plan.num_depths``)."""
        return (width, None) if self.depth_plan is None else self.depth_plan.shape(width)

    def window_offset(self, round: int, client: int) -> int:
        """First channel of the client's window in every scaled dim (wrapping). Default 0: the leading slice."""
        return 0

    def channel_sets(self, round: int, client: int, width: float) -> Optional[List[List[int]]]:
        """Per channel group of the model (a sequential conv/linear chain, :func:`hasfl_ray.models.index_slicing.
        channel_groups`), the sorted channels the client trains, ceil(width x C) of each; the next layer's inputs
        follow and the update travels as index sets. Default None: the leading slice (or the window)."""
        return None

    def parameter_masks(self, round: int, client: int, width: float) -> Optional[Dict[str, "torch.Tensor"]]:
        """Unstructured sub-models (FIARSE-style): parameter name -> torch.bool tensor of that parameter's full
        shape, True at the coordinates ``client`` holds. The client trains the full-shape network with each masked
        parameter's effective weight w ⊙ m (gradient g ⊙ m; an objective may use its own, :meth:`~hasfl_ray.
        training.task.LocalObjective.held`), the parameters not named whole; the masks travel as bitmasks and the
        update as :class:`~hasfl_ray.aggregation.packed.MaskedUpdate` s. May be asked more than once a round (the
        device clock prices the bitmask first): the same round and client must give the same masks. Default None:
        the leading slice (or the window, the channel sets, the depth)."""
        return None

    def aggregation_weights(self, clients: Sequence[int]) -> List[float]:
        """Weights of the coordinate-wise mean, one per participant: the sample counts n_i (the default), or 1 each
        with the run's ``aggregation_weights: count`` (HeteroFL's and FedRolex's combine; FedBuff's (1/K) mean)."""
        if getattr(self.config, "aggregation_weights", "samples") == "count":
            return [1.0] * len(clients)
        return [float(self.num_samples[i]) for i in clients]

    def inspect_updates(self, round: int, global_params: Dict[str, "torch.Tensor"],
                        results: Sequence[ClientResult]) -> None:
        """Rounds only, before :meth:`observe`: the accepted participants' results in client order *with* their
        updates (dense tensors, :class:`~hasfl_ray.aggregation.packed.IndexedUpdate` for an index-set client,
        :class:`~hasfl_ray.aggregation.packed.MaskedUpdate` for a masked parameter) and the global parameters w^t
        they started from (name -> CPU tensor), e.g. FLuID's invariant neurons.
        Called only for an algorithm that overrides it (:mod:`hasfl_ray.engine.inspection`), which then costs
        a copy of w^t and the updates' way back to the driver each round. Default: nothing."""

    inspect_updates.inspects_nothing = True  # the engine asks this, not the class (it imports no algorithm)

    def post_aggregate(self, round: int, before: Dict[str, "torch.Tensor"], after: Dict[str, "torch.Tensor"],
                       results: Sequence[ClientResult]) -> Optional[Dict[str, "torch.Tensor"]]:
        """A synchronous round's server correction (DepthFL's FedDyn): given the global parameters before the round
        (``before``) and after the aggregate was applied (``after``; name -> full-shape tensor on the CPU) and the
        accepted results (``update`` emptied), the new global parameters, or None to keep ``after``. Called, before
        :meth:`observe`, only where a subclass overrides it (:mod:`hasfl_ray.engine.post_aggregate`); never in the
        asynchronous mode."""
        return None

    post_aggregate.base_default = True  # the engine asks this, not the class (it imports no algorithm)

    def observe(self, round: int, results: Sequence[ClientResult], aggregate: AggregateResult) -> None:
        """React to the round's aggregate (estimates, allocations, control variates). Default: nothing.

        ``results`` are the accepted participants' results in client order with ``update`` emptied (the
        packed tensors stay on the server); ``aggregate.delta`` is empty for the same reason.
        """

    # -- the asynchronous mode (docs/async.md) -------------------------------------------------------------------

    #: In an asynchronous run: the simulated seconds now, i.e. at the dispatch being allocated (``allocate`` is
    #: asked once per dispatched client, ``round`` then being the server's model version); None in rounds.
    now: Optional[float] = None

    def arrived(self, version: int, arrivals: Sequence[Arrival]) -> None:
        """An asynchronous run's server update ``version`` (0-based) is about to apply ``arrivals`` (in arrival
        order; :meth:`observe` follows with their results): each update's staleness and its dispatch and arrival
        times. Never called in rounds. Default: nothing."""

    def submodel_for_eval(self, params: Dict[str, "torch.Tensor"], width: float) -> Optional[Dict[str, "torch.Tensor"]]:
        """The width-``width`` sub-model that accuracy at each width and local accuracy evaluate, cut from the
        global parameters ``params`` (name -> full-shape tensor on the CPU): name -> tensor of the width-``width``
        network's shapes (``build_model(model, width)``). Default None: the nested prefix
        (:func:`hasfl_ray.models.extract`), as for every built-in (FedRolex's window at offset 0). With
        :attr:`masked_submodels` the full shapes instead, masked (FIARSE's). Width 1.0 is always the full global
        model (``test_accuracy``)."""
        return None

    submodel_for_eval.prefix_default = True  # the engine's guard asks this, not the class (it imports no algorithm)
    #: Whether :meth:`submodel_for_eval` returns masked sub-models: every parameter at its full shape (zeros outside
    #: the mask), evaluated with the full-shape network (FIARSE's); False: the width-p network's shapes.
    masked_submodels: ClassVar[bool] = False

    def h_tilde(self) -> Optional[np.ndarray]:
        """Heterogeneity estimates H̃ per client, where the algorithm keeps them."""
        return None

    def state_dict(self) -> Dict[str, Any]:
        return {"p_current": self.p_current.copy()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.p_current = np.asarray(state["p_current"], dtype=np.float64).copy()
