"""Full-model methods: p = 1 for all, FedProx's proximal gradient, SCAFFOLD's control variates by hand."""

import numpy as np
import pytest
import torch
from torch import nn

from algorithm_runs import P_MAX_4, SAMPLES_4, small_config
from hasfl_ray.aggregation import AggregateResult
from hasfl_ray.files import OWNER_MARK
from hasfl_ray.algorithms.fullmodel import (SCAFFOLD, SCAFFOLD_DRIFT, ControlVariateObjective, ControlVariateStore,
                                            FedAvg, FedProx, ProximalObjective)
from hasfl_ray.training.local import ClientResult

EMPTY = AggregateResult({}, torch.zeros(0), torch.zeros(0), 1.0)


def tiny_model(weight, bias):
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([weight]))
        model.bias.copy_(torch.tensor([bias]))
    return model


def test_full_model_methods_train_every_client_at_full_width(config4):
    for cls in (FedAvg, FedProx, SCAFFOLD):
        algorithm = cls(small_config(algorithm=cls.name), P_MAX_4, SAMPLES_4)
        assert algorithm.allocate(0, [0, 1, 2, 3]) == {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}
        np.testing.assert_array_equal(algorithm.p_current, np.ones(4))


def test_fedprox_proximal_gradient_is_mu_times_distance_to_the_global_model():
    model = tiny_model([1.0, -2.0], 0.5)
    initial = {"weight": torch.tensor([[0.5, -1.0]]), "bias": torch.tensor([1.5])}
    objective = ProximalObjective(mu=0.3)
    objective.setup(model, initial, 1.0, torch.Generator())
    model.weight.grad = torch.tensor([[0.1, 0.2]])
    model.bias.grad = torch.tensor([-0.4])
    objective.adjust_gradients(model)
    # g + mu (w - w^t): weight [0.1 + 0.3*0.5, 0.2 + 0.3*(-1)], bias -0.4 + 0.3*(-1)
    torch.testing.assert_close(model.weight.grad, torch.tensor([[0.25, -0.1]]))
    torch.testing.assert_close(model.bias.grad, torch.tensor([-0.7]))
    assert FedProx(small_config(algorithm="fedprox", mu=0.3), P_MAX_4, SAMPLES_4).objective(0, 1, 1.0).mu == 0.3


def test_scaffold_local_correction_and_option_ii_drift():
    model = tiny_model([1.0, 2.0], 3.0)
    initial = {"weight": torch.tensor([[1.5, 1.0]]), "bias": torch.tensor([2.0])}
    correction = {"weight": torch.tensor([[0.5, -0.5]]), "bias": torch.tensor([1.0])}
    objective = ControlVariateObjective(correction)
    objective.setup(model, initial, 1.0, torch.Generator())
    model.weight.grad = torch.tensor([[1.0, 1.0]])
    model.bias.grad = torch.tensor([0.0])
    objective.adjust_gradients(model)  # g − c_i + c
    torch.testing.assert_close(model.weight.grad, torch.tensor([[1.5, 0.5]]))
    torch.testing.assert_close(model.bias.grad, torch.tensor([1.0]))
    drift = objective.finish(model, initial, steps=4, lr=0.25)[SCAFFOLD_DRIFT]  # (x − y) / (K η), K η = 1
    torch.testing.assert_close(drift["weight"], torch.tensor([[0.5, -1.0]]))
    torch.testing.assert_close(drift["bias"], torch.tensor([-1.0]))


def result_with_drift(client, values):
    return ClientResult(client, 1.0, {}, 10, 0.0, 4, {SCAFFOLD_DRIFT: {"w": torch.tensor(values)}})


def test_scaffold_control_variate_update_hand_computed(config4):
    algorithm = SCAFFOLD(small_config(algorithm="scaffold"), P_MAX_4, SAMPLES_4)  # N = 4
    assert algorithm.server_lr == 1.0 and algorithm.objective(0, 0, 1.0).correction is None
    # round 0, c = c_i = 0: c_i+ = drift_i; c = (1/N) Σ Δc_i
    algorithm.observe(0, [result_with_drift(0, [4.0, 0.0]), result_with_drift(2, [0.0, 8.0])], EMPTY)
    torch.testing.assert_close(algorithm.server_control, torch.tensor([1.0, 2.0]))
    torch.testing.assert_close(algorithm.client_controls.get(0), torch.tensor([4.0, 0.0]))
    torch.testing.assert_close(algorithm.client_controls.get(2), torch.tensor([0.0, 8.0]))
    assert algorithm.client_controls.clients() == [0, 2]  # only participants are stored
    # corrections c − c_i sent next round
    torch.testing.assert_close(algorithm.objective(1, 0, 1.0).correction["w"], torch.tensor([-3.0, 2.0]))
    torch.testing.assert_close(algorithm.objective(1, 1, 1.0).correction["w"], torch.tensor([1.0, 2.0]))
    # round 1: client 0 again (c_0 = [4, 0]) and client 1 new (c_1 = 0), with c = [1, 2]
    algorithm.observe(1, [result_with_drift(0, [2.0, 2.0]), result_with_drift(1, [1.0, 1.0])], EMPTY)
    # c_0+ = [4,0] − [1,2] + [2,2] = [5, 0]  (Δ = [1, 0]);  c_1+ = 0 − [1,2] + [1,1] = [0, −1]  (Δ = [0, −1])
    torch.testing.assert_close(algorithm.client_controls.get(0), torch.tensor([5.0, 0.0]))
    torch.testing.assert_close(algorithm.client_controls.get(1), torch.tensor([0.0, -1.0]))
    torch.testing.assert_close(algorithm.server_control, torch.tensor([1.25, 1.75]))  # c + ([1, −1]) / 4
    clone = SCAFFOLD(small_config(algorithm="scaffold"), P_MAX_4, SAMPLES_4)
    clone.load_state_dict(algorithm.state_dict())
    torch.testing.assert_close(clone.server_control, algorithm.server_control)
    for client in (0, 1, 2):
        torch.testing.assert_close(clone.client_controls.get(client), algorithm.client_controls.get(client))
    assert 3 not in clone.client_controls


def test_control_variate_store_on_disk_matches_memory(tmp_path):
    memory, disk = ControlVariateStore(), ControlVariateStore(str(tmp_path / "cv"))
    for store in (memory, disk):
        store.put(7, torch.arange(5.0))
        store.put(2, torch.ones(5))
        store.put(7, torch.full((5,), 3.0))
    assert disk.clients() == memory.clients() == [2, 7] and disk.get(0) is None
    for client in (2, 7):
        torch.testing.assert_close(disk.get(client), memory.get(client))
    # the c_i files, and the mark of a folder hasfl-ray made (hasfl_ray.files.claim_folder: a store used without the
    # engine makes and marks its folder as the engine does)
    assert sorted(p.name for p in (tmp_path / "cv").iterdir()) == sorted([OWNER_MARK, "client_2.pt", "client_7.pt"])
    restored = ControlVariateStore(str(tmp_path / "other"))
    restored.load_state_dict(memory.state_dict())
    torch.testing.assert_close(restored.get(7), torch.full((5,), 3.0))


def test_scaffold_defaults_to_vanilla_sgd_and_warns_under_momentum(caplog):
    assert small_config(algorithm="scaffold").momentum == 0.0
    assert small_config(algorithm="fedavg").momentum == 0.9
    assert small_config(algorithm="scaffold", momentum=0.9).momentum == 0.9
    with caplog.at_level("WARNING"):
        SCAFFOLD(small_config(algorithm="scaffold", momentum=0.9), P_MAX_4, SAMPLES_4)
    assert "diverge" in caplog.text


def test_scaffold_run_is_identical_with_control_variates_on_disk(tmp_path):
    from hasfl_ray.engine import Engine, RunConfig

    base = dict(algorithm="scaffold", rounds=2, clients_per_round=4, seed=3)
    memory = Engine(RunConfig(backend="local", **base)).run()
    engine = Engine(RunConfig(backend="local", **base, control_variates_dir=str(tmp_path / "cv")))
    disk = engine.run()
    assert disk["params_sha256"] == memory["params_sha256"]
    assert len(list((tmp_path / "cv").glob("client_*.pt"))) == len(engine.algorithm.client_controls.clients()) > 4


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "scaffold"])
def test_avg_p_is_one_and_nothing_stays_frozen(algorithm):
    from algorithm_runs import LEARNING_RUN, recorded_run

    run = recorded_run(algorithm=algorithm, **LEARNING_RUN)
    assert all(line["avg_p"] == 1.0 for line in run.history)
    # an update can round away in float32 on a handful of coordinates in one round, never for long
    assert all(line["frozen_fraction"] < 1e-4 for line in run.history)
    assert run.history[-1]["frozen_fraction"] == 0.0
