"""A Flower strategy from any hasfl-ray policy, and the Flower client that trains as hasfl-ray's trainers do.

``Strategy(policy, ...)`` is a ``flwr.server.strategy.Strategy`` whose rounds are hasfl-ray's (docs/flower.md):

- ``configure_fit`` of Flower round r is hasfl-ray's round t = r - 1: the participants
  (:func:`~hasfl_ray.engine.participants.sample_participants` of the run's seed, those of them connected), the
  policy's widths (``allocate``), sub-model shapes, windows
  (``window_offset``) and channel sets, the round's learning rate and objectives: each participant is handed its
  width-p sub-model's parameters (cut from the global model as a trainer cuts them,
  :meth:`~hasfl_ray.training.workspace.Workspace.starting_point`) and its :class:`~hasfl_ray.training.task.ClientTask`;
- ``aggregate_fit`` takes the clients' packed width-p updates and aggregates them with the fused kernel
  (:meth:`~hasfl_ray.engine.server.Server.apply`: :func:`~hasfl_ray.aggregation.aggregate_updates`, or its windows
  and label-split forms), with the policy's ``inspect_updates`` / ``post_aggregate`` hooks, then tells the policy
  (``observe``): a policy adapts exactly as in ``hasfl-ray simulate``;
- ``evaluate`` is the server's central evaluation of the full-width global model on the run's test set.

A Flower client knows which hasfl-ray client it is (its data partition): :func:`client_fn` builds
:class:`FlowerClient` from ``context.node_config["partition-id"]`` (Flower's simulation), and the strategy asks each
connected client once for it (``get_properties``), so it picks hasfl-ray's participants by their ids. Flower's
``flwr`` is imported only when one of these is used; without it they refuse in one sentence naming the extra.

The task and a client's extras (e.g. SCAFFOLD's drift) travel pickled in the Flower config and metrics: deploy the
strategy only with clients that trust their server and servers that trust their clients, as hasfl-ray's own actors do.
"""

from __future__ import annotations

import pickle
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from hasfl_ray.errors import ConfigError

#: The Flower config key of a client's task and the property a client answers with its hasfl-ray client id.
TASK_KEY, CLIENT_KEY = "hasfl-task", "hasfl-client"
_CLASSES: Dict[str, type] = {}


def _flwr() -> Any:
    """The ``flwr`` package, or one sentence naming the extra that installs it."""
    try:
        import flwr
        import flwr.client  # noqa: F401
        import flwr.server.strategy  # noqa: F401
    except ImportError:
        raise ConfigError('hasfl_ray.flower needs Flower (the flwr package), which is not installed here; expected '
                          'it installed: pip install "hasfl-ray[flower]"') from None
    return flwr


def sub_model_names(workspace: Any, task: Any) -> List[str]:
    """The names of the parameters ``task``'s sub-model holds, in the order they travel (its depth's, else all)."""
    return workspace.depth_names(task.depth) if task.depth is not None else list(workspace.specs)


def _arrays(tensors: Any) -> List[np.ndarray]:
    """Tensors (an index-set update: its values) as the float32 arrays Flower's parameters carry."""
    return [(t if isinstance(t, torch.Tensor) else t.values).detach().cpu().contiguous().numpy() for t in tensors]


# -- the server's side -------------------------------------------------------------------------------------------

def Strategy(policy: Any = None, config: Any = None, *, dataset: Any = None, algorithm_options: Any = None,
             timeout: float = 600.0, **fields: Any) -> Any:
    """A Flower strategy running hasfl-ray's ``policy`` (an algorithm's name, ``FILE.py:Class`` / ``MODULE:Class``
    or an Algorithm subclass; default the config's) on the run ``config`` (a RunConfig, a mapping or a YAML path,
    with ``fields`` over it: :func:`hasfl_ray.api.make_config`, as :func:`hasfl_ray.simulate` takes them).
    ``timeout``: seconds to wait for the run's clients to connect. Flower's ``num_rounds`` sets the rounds."""
    from hasfl_ray.api import make_config

    run_config = make_config(config, algorithm=policy, dataset=dataset, algorithm_options=algorithm_options, **fields)
    if run_config.mode != "sync" or run_config.devices is not None:  # (mode async needs devices)
        raise ConfigError(f"mode is {run_config.mode!r} with a simulated device population (devices); expected mode "
                          "sync without devices for a Flower strategy, whose clients are real devices")
    if run_config.participation != "fixed":
        raise ConfigError(f"participation is {run_config.participation!r}; expected fixed for a Flower strategy, "
                          "whose rounds draw clients_per_round of the connected clients")
    flwr = _flwr()
    if "strategy" not in _CLASSES:
        _CLASSES["strategy"] = type("HasflStrategy", (_StrategyBase, flwr.server.strategy.Strategy), {})
    return _CLASSES["strategy"](run_config, timeout)


def _server_backend() -> Any:
    from hasfl_ray.engine.backend import LocalBackend

    class FlowerBackend(LocalBackend):
        """The local backend's server (and the workspace that cuts sub-models), whose rounds' updates are the
        Flower clients' (``arrived``, in task order) instead of its own trainer's."""

        name = "flower"
        arrived: List[Any] = []

        def run_round(self, tasks, weights, server_lr, keep_updates=False):
            return self.server.apply(self.arrived, weights, server_lr, keep_updates=keep_updates)

    return FlowerBackend()


class _StrategyBase:
    """The strategy's methods (mixed into ``flwr.server.strategy.Strategy`` by :func:`Strategy`)."""

    def __init__(self, config: Any, timeout: float):
        from hasfl_ray.engine import Engine

        self.engine = Engine(config, backend=_server_backend())
        self.engine.prepare()
        e = self.engine
        e.backend.start(e.config, e.dataset, e.model_name, e.initial_params)
        self.config, self.timeout = e.config, timeout
        self.names = list(e.backend.server.params)
        self.ids: Dict[str, int] = {}  # Flower's client (proxy) id -> hasfl-ray client id
        self.round: Optional[Tuple[int, list, list]] = None
        self.history: List[Dict[str, Any]] = []

    def __repr__(self) -> str:
        return f"hasfl_ray.flower.Strategy({self.config.algorithm!r})"

    @property
    def params(self) -> Dict[str, torch.Tensor]:
        """The global parameters now (name -> CPU tensor)."""
        return self.engine.backend.get_params()

    def params_sha256(self) -> str:
        return self.engine.backend.params_sha256()

    def _global(self) -> Any:
        from flwr.common import ndarrays_to_parameters

        return ndarrays_to_parameters(_arrays(self.engine.backend.server.params[n] for n in self.names))

    def initialize_parameters(self, client_manager: Any) -> Any:
        return self._global()

    def _set(self, parameters: Any) -> None:
        """Flower's global parameters (the strategy's own, unless something between changed them) into the server."""
        from flwr.common import parameters_to_ndarrays

        arrays = parameters_to_ndarrays(parameters)
        if len(arrays) == len(self.names):
            self.engine.backend.set_params({n: torch.from_numpy(np.array(a)) for n, a in zip(self.names, arrays)})

    def _clients(self, client_manager: Any) -> Dict[int, Any]:
        """hasfl-ray client id -> the connected Flower client, each asked its id once (``get_properties``)."""
        from flwr.common import GetPropertiesIns

        client_manager.wait_for(self.config.clients, int(self.timeout))
        out = {}
        for cid, proxy in client_manager.all().items():
            if cid not in self.ids:
                answer = proxy.get_properties(GetPropertiesIns({}), self.timeout, None)
                self.ids[cid] = int(answer.properties[CLIENT_KEY])
            out[self.ids[cid]] = proxy
        return out

    def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> List[Tuple[Any, Any]]:
        from flwr.common import FitIns, ndarrays_to_parameters

        from hasfl_ray.engine.participants import client_task, round_capacities, sample_participants, sub_models
        from hasfl_ray.schedule import round_lr

        e, c, t = self.engine, self.config, server_round - 1
        self._set(parameters)
        proxies = self._clients(client_manager)
        participants = [i for i in sample_participants(c.seed, t, c.clients, c.clients_per_round) if i in proxies]
        if c.width_assignment == "dynamic":  # every client's p^max redrawn from the ladder's mix
            e.p_max = round_capacities(c.seed, t, c.clients, e.ladder)
            e.algorithm.set_capacities(t, e.p_max)
        widths = e.algorithm.allocate(t, participants)
        shapes = sub_models(e.algorithm, t, widths)
        lr = round_lr(c.lr, c.lr_decay, t, c.lr_milestones, c.lr_gamma)
        tasks = [client_task(e.algorithm, c, t, i, widths[i], shapes[i], lr) for i in participants]
        weights = e.algorithm.aggregation_weights(participants) if participants else []
        kept = [k for k, weight in enumerate(weights) if weight > 0]  # a zero weight: not trained either
        tasks, weights = [tasks[k] for k in kept], [weights[k] for k in kept]
        self.round = (t, tasks, weights)
        workspace, server = e.backend.trainer.workspace, e.backend.server
        out = []
        for task in tasks:
            start = workspace.starting_point(task, server.params)
            out.append((proxies[task.client], FitIns(ndarrays_to_parameters(_arrays(start.values())),
                                                     {TASK_KEY: pickle.dumps(task)})))
        return out

    def _result(self, task: Any, res: Any) -> Any:
        """The :class:`ClientResult` a Flower client's ``FitRes`` carries."""
        from flwr.common import parameters_to_ndarrays

        from hasfl_ray.aggregation.packed import IndexedUpdate
        from hasfl_ray.training.result import ClientResult

        workspace, m = self.engine.backend.trainer.workspace, res.metrics
        update = {n: torch.from_numpy(np.array(a)) for n, a in zip(sub_model_names(workspace, task),
                                                                  parameters_to_ndarrays(res.parameters))}
        if task.channels is not None:  # the channels it held: index sets, as the server knows them
            sets = workspace.index_sets(task)
            update = {n: IndexedUpdate(tensor, sets[n]) for n, tensor in update.items()}
        trained = m.get("trained-width")
        return ClientResult(task.client, task.width, update, int(res.num_examples), float(m["loss"]), int(m["steps"]),
                            pickle.loads(m["extras"]) if "extras" in m else {}, offset=task.offset,
                            trained_width=None if trained is None or trained < 0 else float(trained))

    def aggregate_fit(self, server_round: int, results: List[Tuple[Any, Any]], failures: List[Any]
                      ) -> Tuple[Optional[Any], Dict[str, Any]]:
        from hasfl_ray.engine.post_aggregate import aggregate_round

        e = self.engine
        t, tasks, weights = self.round
        arrived = {int(res.metrics["client"]): res for _, res in results}
        kept = [k for k, task in enumerate(tasks) if task.client in arrived]  # a failed client counts for nothing
        tasks, weights = [tasks[k] for k in kept], [weights[k] for k in kept]
        e.backend.arrived = [self._result(task, arrived[task.client]) for task in tasks]
        if tasks:
            accepted, aggregate = aggregate_round(e, t, tasks, weights)
        else:
            accepted, aggregate = [], e._empty_aggregate()
        e.backend.arrived = []
        e.algorithm.observe(t, accepted, aggregate)
        used = [r.width if r.trained_width is None else r.trained_width for r in accepted]
        line = {"round": t, "avg_p": float(np.mean(used)) if used else 0.0, "coverage": aggregate.covered_fraction,
                "accepted": len(accepted), "failures": len(failures) + len(self.round[1]) - len(tasks)}
        self.history.append(line)
        return self._global(), line

    def configure_evaluate(self, server_round: int, parameters: Any, client_manager: Any) -> List[Tuple[Any, Any]]:
        return []  # the global model is evaluated centrally (evaluate)

    def aggregate_evaluate(self, server_round: int, results: List[Any], failures: List[Any]
                           ) -> Tuple[Optional[float], Dict[str, Any]]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Any) -> Optional[Tuple[float, Dict[str, Any]]]:
        """The global model's (loss, {"accuracy"}) on the run's test set: the simulation's ``test_accuracy`` (the full
        network's, or DepthFL's ensemble of its exits, :func:`~hasfl_ray.engine.evaluating.global_evaluation`)."""
        from hasfl_ray.engine.evaluating import global_evaluation

        self._set(parameters)
        ensemble = bool(getattr(self.engine.algorithm, "global_ensemble", False))
        accuracy, loss = global_evaluation(self.engine, ensemble)()
        if 0 < server_round <= len(self.history):  # the round's line, as metrics.jsonl's test_accuracy/test_loss
            self.history[server_round - 1].update(test_accuracy=float(accuracy), test_loss=float(loss))
        return float(loss), {"accuracy": float(accuracy)}


# -- the clients' side -------------------------------------------------------------------------------------------

_TRAINERS: Dict[str, Any] = {}  # one trainer per process and run config (its dataset loaded once)


def _trainer(config: Any) -> Any:
    from hasfl_ray.engine.backend import optimizer_settings
    from hasfl_ray.engine.preparing import run_dataset
    from hasfl_ray.training.determinism import apply_determinism
    from hasfl_ray.training.trainer import Trainer

    key = repr(sorted(config.to_dict().items()))
    if key not in _TRAINERS:
        apply_determinism(config.deterministic)
        dataset = run_dataset(config)
        _TRAINERS[key] = Trainer(dataset, dataset.model, optimizer_settings(config), config.device,
                                 config.trainer_threads)
    return _TRAINERS[key]


def FlowerClient(client: int, config: Any = None, **fields: Any) -> Any:
    """A Flower ``NumPyClient`` that is hasfl-ray's client ``client`` of the run ``config`` (as :func:`Strategy`
    takes it): it trains the width-p sub-model it is sent with hasfl-ray's trainer
    (:meth:`~hasfl_ray.training.trainer.Trainer.train_from`) and returns its packed update."""
    flwr = _flwr()
    from hasfl_ray.api import make_config

    run_config = make_config(config, **fields).resolved()
    if "client" not in _CLASSES:
        _CLASSES["client"] = type("HasflClient", (_ClientBase, flwr.client.NumPyClient), {})
    return _CLASSES["client"](int(client), run_config)


class _ClientBase:
    def __init__(self, client: int, config: Any):
        self.client, self.config = client, config
        self.trainer = _trainer(config)
        if not 0 <= client < self.trainer.dataset.num_clients:
            raise ConfigError(f"Flower client {client} is not a client of this run; expected a partition id from 0 to "
                              f"{self.trainer.dataset.num_clients - 1}")

    def get_properties(self, config: Dict[str, Any]) -> Dict[str, Any]:
        return {CLIENT_KEY: self.client}

    def fit(self, parameters: List[np.ndarray], config: Dict[str, Any]) -> Tuple[List[np.ndarray], int, Dict]:
        task = pickle.loads(config[TASK_KEY])
        if task.client != self.client:
            raise ValueError(f"client {self.client} was sent client {task.client}'s task; expected its own")
        names = sub_model_names(self.trainer.workspace, task)
        start = {n: torch.from_numpy(np.array(a)) for n, a in zip(names, parameters)}
        result = self.trainer.train_from(task, start)
        metrics = {"client": result.client, "loss": float(result.loss), "steps": int(result.steps),
                   "trained-width": -1.0 if result.trained_width is None else float(result.trained_width)}
        if result.extras:
            metrics["extras"] = pickle.dumps(result.extras)
        return _arrays(result.update[n] for n in names), int(result.num_samples), metrics


def client_fn(config: Any = None, **fields: Any) -> Any:
    """Flower's ``client_fn(context)`` for the run ``config``: the client of ``context.node_config["partition-id"]``
    (Flower's simulation numbers its nodes' partitions 0..N-1), as a Flower ``Client``."""
    _flwr()

    def make(context: Any) -> Any:
        return FlowerClient(int(context.node_config["partition-id"]), config, **fields).to_client()

    return make


__all__ = ["Strategy", "FlowerClient", "client_fn", "sub_model_names", "TASK_KEY", "CLIENT_KEY"]
