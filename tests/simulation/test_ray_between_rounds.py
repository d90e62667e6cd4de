"""What the driver does between two Ray rounds (issue 46 item 3): from the last trainer call's results of a round to
the next round's first call, the trainers wait for it, so it aggregates and sends, and nothing else: the engine's
records (metrics files with their fsyncs, TensorBoard, checkpoints) and its memory release run while trainers train.
And each trainer gets a model's parameters once: its later calls name their version. Placement only: the run is the
local backend's bit for bit. The backend starts its own Ray here (the parameters then ride inside the calls)."""

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from hasfl_ray import allocator  # noqa: E402
from hasfl_ray.engine import Engine, RunConfig, records  # noqa: E402
from hasfl_ray.simulation import server_port, transport  # noqa: E402
from hasfl_ray.simulation.actors import Held, Inline  # noqa: E402

CONFIG = dict(dataset="digits", algorithm="hasfl", clients=8, clients_per_round=4, rounds=6, local_epochs=1, seed=3,
              checkpoint_every=2, eval_samples=120)


def test_between_two_rounds_the_driver_only_aggregates_and_sends_and_parameters_travel_once(tmp_path, monkeypatch):
    assert not ray.is_initialized()  # else the backend would join it, and put the parameters in the store
    events, carried = [], []

    def watch(owner, name, label):
        original = getattr(owner, name)

        def watched(*args, **kwargs):
            events.append(label)
            return original(*args, **kwargs)
        monkeypatch.setattr(owner, name, watched)

    watch(server_port.DriverServer, "receive", "receive")
    watch(server_port.DriverServer, "round", "round")
    watch(records, "while_training", "records")
    watch(allocator, "release", "trim")
    carry = transport.Transport._carried

    def carried_watched(slot, params):
        sent = carry(slot, params)
        events.append("send")
        carried.append((slot.index, slot.generation, sent[0]))
        return sent
    monkeypatch.setattr(transport.Transport, "_carried", staticmethod(carried_watched))

    got = Engine(RunConfig(**CONFIG, backend="ray", actors=2, server_placement="driver"),
                 out_dir=str(tmp_path / "ray")).run()
    monkeypatch.undo()
    local = Engine(RunConfig(**CONFIG, backend="local"), out_dir=str(tmp_path / "local")).run()
    assert got["params_sha256"] == local["params_sha256"]
    with open(tmp_path / "ray" / "metrics.jsonl") as ray_lines, open(tmp_path / "local" / "metrics.jsonl") as ours:
        assert len(ray_lines.readlines()) == len(ours.readlines()) == CONFIG["rounds"]

    rounds = [k for k, event in enumerate(events) if event == "round"]
    assert len(rounds) == CONFIG["rounds"] and "records" in events and "trim" in events
    for k in rounds:
        last_result = max(j for j in range(k) if events[j] == "receive")
        next_call = next((j for j in range(k, len(events)) if events[j] == "send"), len(events))
        between = events[last_result + 1:next_call]
        assert "records" not in between and "trim" not in between, (k, between)

    inline = [(slot, generation, sent.version) for slot, generation, sent in carried if isinstance(sent, Inline)]
    held = [sent for _, _, sent in carried if isinstance(sent, Held)]
    assert len(inline) == len(set(inline))  # each version reaches a trainer once
    assert held  # the round's evaluations behind the training name the version instead
    last = {}
    for slot, generation, sent in carried:  # a Held names the version its trainer's previous parameters were
        if isinstance(sent, Held):
            assert last[slot, generation] == sent.version
        else:
            last[slot, generation] = sent.version
