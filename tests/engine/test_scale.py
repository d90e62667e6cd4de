"""Many clients: start-up keeps per-client state in numpy arrays (no Python object per client), clients.csv streams
one row per client, and a client's data is generated only where it is sampled."""

import csv
import time
import tracemalloc

import numpy as np

from hasfl_ray.analysis.report import confound_statistics
from hasfl_ray.data.synthetic import EXACT_TV_CLIENTS, ClientNames
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.engine import sample_participants


def test_100k_clients_start_without_per_client_python_objects():
    config = RunConfig(dataset="synthetic", clients=100_000, clients_per_round=10, rounds=1, backend="local",
                       checkpoint_every=0)
    engine = Engine(config)
    tracemalloc.start()
    begin = time.perf_counter()
    engine.prepare()
    seconds = time.perf_counter() - begin
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert isinstance(engine.dataset.client_names, ClientNames) and len(engine.dataset.client_names) == 100_000
    assert engine.dataset.client_names[99_999] == "client_99999"
    for array in (engine.num_samples, engine.p_max, engine.algorithm.p_current, engine.algorithm.h):
        assert isinstance(array, np.ndarray) and array.shape == (100_000,)
    assert engine.dataset._cache == {}  # no client's samples were generated
    # numpy arrays of 100,000 entries are 0.8 MB each; 5 MB measured; a Python list of names and of sizes made it 13 MB
    assert peak < 9e6, f"prepare() allocated {peak / 1e6:.1f} MB for 100,000 clients"
    assert seconds < 30  # a generous sanity bound (about 0.2 s measured on a shared 2-core machine)


def test_clients_csv_streams_every_client_and_tv_only_for_sampled_ones(tmp_path):
    clients = EXACT_TV_CLIENTS + 2_000
    config = RunConfig(dataset="synthetic", clients=clients, clients_per_round=4, rounds=2, backend="local",
                       checkpoint_every=0, warmup=0, t_adapt=1)
    Engine(config, out_dir=str(tmp_path)).run()
    with open(tmp_path / "clients.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["client"]) for r in rows] == list(range(clients))
    assert rows[5]["name"] == "client_5"
    sampled = {i for t in range(2) for i in sample_participants(config.seed, t, clients, 4)}
    with_tv = {int(r["client"]) for r in rows if r["tv_distance"] != ""}
    assert with_tv == sampled
    assert all(0 <= float(rows[i]["tv_distance"]) <= 1 for i in sampled)
    # Table 5's statistics skip the clients without a TV distance instead of failing on them
    assert confound_statistics(rows)["n_clients"] == len(sampled)
