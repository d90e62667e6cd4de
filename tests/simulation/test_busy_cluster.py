"""A cluster joined by address whose CPUs another job holds (issue h59): Ray places the run's actors only once that
job ends, so the run waited without a word and a Ctrl-C or SIGTERM was taken only then (a run joining a 1-CPU
cluster beside a 400-round run: SIGTERM at 90 s, stopped 33 s later, when the other run ended). The wait now says
what it waits for and a stop ends it at once."""

import logging
import os
import signal
import threading

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")
from ray.cluster_utils import Cluster  # noqa: E402

from hasfl_ray.engine import Engine, RunConfig  # noqa: E402
from hasfl_ray.errors import RunInterrupted  # noqa: E402
from hasfl_ray.simulation import waiting  # noqa: E402


@pytest.fixture
def busy_cluster():
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, include_dashboard=False,
                                                                object_store_memory=128 * 1024 ** 2))
    ray.init(address=cluster.address, logging_level="warning")

    class Holder:  # another job's actor, holding the cluster's only CPU (defined here: pickled by value)
        def ready(self):
            return True
    holder = ray.remote(num_cpus=1)(Holder).remote()
    ray.get(holder.ready.remote())
    yield cluster, holder
    ray.shutdown()
    cluster.shutdown()


class SignalOnNotice(logging.Handler):
    """Sends SIGTERM to this process when the wait's notice is logged (in the main thread, inside the run)."""

    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_stop_while_a_busy_cluster_holds_the_cpus_stops_the_run_at_once_and_says_what_it_waited_for(
        busy_cluster, tmp_path, monkeypatch):
    cluster, holder = busy_cluster
    monkeypatch.setattr(waiting, "PLACEMENT_NOTICE_S", 0.0)
    notice = SignalOnNotice()
    logging.getLogger("hasfl_ray.simulation.waiting").addHandler(notice)
    freed = threading.Event()

    def free_the_cpu():  # before the fix nothing was said and the stop never came: let the run go on, and fail below
        if not freed.wait(90):
            ray.kill(holder)
    watchdog = threading.Thread(target=free_the_cpu, daemon=True)
    watchdog.start()
    engine = Engine(RunConfig(rounds=2, clients=6, clients_per_round=3, seed=3, backend="ray", actors=1,
                              address=cluster.address), out_dir=str(tmp_path / "run"))
    try:
        with pytest.raises(RunInterrupted) as stopped:
            engine.run()
    finally:
        freed.set()
        logging.getLogger("hasfl_ray.simulation.waiting").removeHandler(notice)
    assert stopped.value.signal_number == signal.SIGTERM and stopped.value.rounds_done == 0
    assert notice.messages == [
        "still waiting after 0 s for the Ray cluster to start 1 trainer actor (1 CPU each) and the server actor (0 of "
        "its 1 CPUs free): other jobs may hold them; the run starts once they are free, or Ctrl-C stops it"]
    assert not os.path.exists(tmp_path / "run" / "config.yaml")  # nothing of the run was started
    assert ray.get(holder.ready.remote())  # the other job's actor is untouched
