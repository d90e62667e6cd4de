"""The asynchronous dispatch's client sampling (docs/async.md, Dispatch): candidates drawn a few at a time give the
client that the documented rule (DRAWS candidates of ``rng(seed, STREAM_CLOCK, n, 2)``, the first available and not
in flight, else the lowest such id, else -1) gives, and count the same unavailable candidates; a whole run is the
bits of numpy's scalar streams and the guard's checked calls (issue 46 item 2)."""

import numpy as np

from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.async_state import InFlight
from hasfl_ray.engine.asynchronous import DRAWS, SAMPLING, AsyncLoop
from hasfl_ray.training.seeding import STREAM_CLOCK, numpy_rng


def reference(loop, n):
    """The rule with DRAWS candidates drawn at once (how it was first written): (client, unavailable candidates)."""
    busy, availability, now, clients = loop.state.in_flight, loop.clock.availability, loop.clock.now, loop.config.clients
    unavailable = 0
    for candidate in numpy_rng(loop.config.seed, STREAM_CLOCK, n, SAMPLING).integers(0, clients, size=DRAWS).tolist():
        if candidate not in busy and availability.window(candidate, now)[0]:
            return candidate, unavailable
        unavailable += candidate not in busy
    free = [i for i in range(clients) if i not in busy and availability.window(i, now)[0]]
    return (free[0] if free else -1), unavailable


def test_sampling_a_few_candidates_at_a_time_is_the_rule_drawn_at_once(tmp_path):
    engine = Engine(RunConfig(backend="local", mode="async", devices="lognormal", availability="markov:1,3",
                              clients=12, clients_per_round=4, concurrency=4, buffer_size=2, rounds=2, seed=3,
                              checkpoint_every=0), out_dir=str(tmp_path / "run"))
    engine.prepare()
    loop = AsyncLoop(engine)
    generator = np.random.default_rng(0)
    outcomes = set()
    for n in range(300):
        loop.clock.now = float(generator.uniform(0, 50))
        loop.state.in_flight = {int(i): InFlight(int(i), 0, 0, 1.0, 0.0, 1.0)
                                for i in generator.choice(12, size=int(generator.integers(0, 12)), replace=False)}
        loop.state.unavailable = 0
        expected = reference(loop, n)
        assert (loop.sample(n), loop.state.unavailable) == expected
        outcomes.add("first" if expected[1] == 0 else "later" if expected[1] < DRAWS // 2 else "rare")
    assert outcomes == {"first", "later", "rare"}  # a first candidate, a later one, and (nearly) every draw missing


class ScalarStreams:
    """numpy's scalar path for every dispatch (how the loop drew before its streams were derived a block at a time)."""

    def __init__(self, prefix, suffix=()):
        self.key = tuple(prefix), tuple(suffix)

    def __call__(self, n):
        rng = numpy_rng(*self.key[0], n, *self.key[1])

        class Draws:
            def integers(self, high, size):
                return rng.integers(0, high, size=size).tolist()

            def random(self, size):
                return rng.random(size).tolist()
        return Draws()


def test_an_async_run_is_the_bits_of_the_scalar_path(tmp_path, monkeypatch):
    """Block-derived streams and a built-in's unchecked calls give the run numpy's scalar streams and the checked
    calls give: the same model and the same metrics lines (dropout and availability drawn, both kinds of stream)."""
    import json

    from hasfl_ray.engine import asynchronous, guard

    config = dict(backend="local", mode="async", devices="lognormal", availability="markov:1,3", dropout=0.3,
                  clients=12, clients_per_round=4, concurrency=4, buffer_size=2, rounds=4, seed=3, checkpoint_every=0)

    def run(name):
        summary = Engine(RunConfig(**config), out_dir=str(tmp_path / name)).run()
        lines = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return summary["params_sha256"], [{k: v for k, v in line.items() if "wall" not in k and k != "time_s"}
                                          for line in lines]

    fast = run("blocks")
    monkeypatch.setattr(asynchronous, "DispatchStreams", ScalarStreams)
    monkeypatch.setattr(guard.GuardedAlgorithm, "_trusted", lambda self, method: False)
    scalar = run("scalar")
    assert fast == scalar
    assert sum(line["dropped_updates"] for line in fast[1]) > 0  # the dropout stream decided something
