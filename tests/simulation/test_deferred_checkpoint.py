"""A round that checkpoints on Ray: its line and checkpoint are written once its evaluation is in, while the next
round trains, from the state kept as it ended; the checkpoints are those of the local backend."""

import copy

import numpy as np
import pytest
import torch

pytest.importorskip("ray", reason="needs Ray")

import hasfl_ray.engine.engine as engine_module  # noqa: E402
from hasfl_ray.engine import Engine, RunConfig  # noqa: E402
from hasfl_ray.engine.checkpoint import state_bytes  # noqa: E402

CONFIG = dict(dataset="digits", algorithm="hasfl", clients=8, clients_per_round=4, rounds=9, local_epochs=1,
              batch_size=32, lr=0.05, seed=3, checkpoint_every=4, eval_samples=120)


def checkpoints_written(monkeypatch, tmp_path, backend, **extra):
    """Each checkpoint the run writes (its params, algorithm state, clock and history, less timings), with the
    number of rounds the engine had started when it was written."""
    started, saved = [], []
    run_round = Engine.run_round

    def counting(self, t):
        started.append(t)
        return run_round(self, t)

    def keep(run_dir, checkpoint):
        kept = copy.deepcopy({"params": checkpoint.params, "state": checkpoint.algorithm_state,
                              "clock": checkpoint.clock})
        history = [{k: v for k, v in line.items() if k != "wall_s"} for line in checkpoint.history]
        saved.append((checkpoint.round, len(started), kept, history))
        save(run_dir, checkpoint)

    save = engine_module.save_checkpoint
    monkeypatch.setattr(Engine, "run_round", counting)
    monkeypatch.setattr(engine_module, "save_checkpoint", keep)
    config = RunConfig(backend=backend, **CONFIG, **extra)
    summary = Engine(config, out_dir=str(tmp_path / backend)).run()
    monkeypatch.undo()
    return summary["params_sha256"], saved


def same(a, b) -> bool:
    """Equal structures, tensors and arrays bit for bit (dtype and shape included)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and \
            torch.equal(a.view(torch.uint8) if a.numel() else a, b.view(torch.uint8) if b.numel() else b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.tobytes() == b.tobytes() and a.shape == b.shape
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


@pytest.fixture(scope="module")
def local_checkpoints(tmp_path_factory):
    """:func:`checkpoints_written` of the local backend, run once for both server placements."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        return checkpoints_written(monkeypatch, tmp_path_factory.mktemp("local"), "local")


@pytest.mark.parametrize("placement", ["driver", "actor"])
def test_a_checkpoint_written_behind_the_next_round_on_ray_equals_the_local_backends(ray_local, monkeypatch,
                                                                                      tmp_path, placement,
                                                                                      local_checkpoints):
    """Wherever the server runs (--server-placement), the checkpoints are the local backend's."""
    local_sha, local = local_checkpoints
    ray_sha, ray = checkpoints_written(monkeypatch, tmp_path, "ray", actors=2, server_placement=placement)
    assert ray_sha == local_sha
    assert [c[0] for c in local] == [c[0] for c in ray] == [4, 8, 9]
    assert [c[1] for c in local] == [4, 8, 9]  # locally, before the next round starts
    assert all(started > rounds for rounds, started, _, _ in ray[:-1])  # on Ray, a round or two later
    for (_, _, local_kept, local_history), (_, _, ray_kept, ray_history) in zip(local, ray):
        assert same(ray_kept, local_kept)  # the parameters and states of that round, not of the rounds run since
        assert ray_history == local_history


def test_a_state_too_large_to_copy_is_checkpointed_before_the_next_round(ray_local, monkeypatch, tmp_path):
    monkeypatch.setattr(engine_module, "SNAPSHOT_BYTES", 0)
    local_sha, local = checkpoints_written(monkeypatch, tmp_path, "local")
    monkeypatch.setattr(engine_module, "SNAPSHOT_BYTES", 0)
    ray_sha, ray = checkpoints_written(monkeypatch, tmp_path, "ray", actors=2)
    assert ray_sha == local_sha
    assert [c[:2] for c in ray] == [(4, 4), (8, 8), (9, 9)]
    assert all(same(r[2], l[2]) and r[3] == l[3] for r, l in zip(ray, local))


def test_state_bytes_counts_tensors_arrays_and_items():
    state = {"a": torch.zeros(10), "b": [np.zeros(4, dtype=np.int64), 1.5], "c": {"d": "x"}}
    assert state_bytes(state) == 40 + 32 + 64 + 64
    assert state_bytes(list(range(20_000))) == 64 * 20_000  # a long list is not looked into
    assert state_bytes(None) == 0
