"""The walk of a trainer's tasks through local training (issue 36 item 4): which modules (rooms) of hasfl_ray
:meth:`Trainer.train_group <hasfl_ray.training.trainer.Trainer.train_group>` enters, and how many times.

The walk is recorded with :func:`sys.setprofile` on tiny real units, on a digits-shaped dataset: a client alone
(eager, with and without CUDA graphs' static steps, which run eagerly on a CPU), two clients of one width (batched)
and two of different widths (``batching="mixed"``). A room is entered when a function of one hasfl_ray module is
called from another (the caller is the nearest hasfl_ray frame: torch in between, as ``nn.Module.__call__`` before a
``forward``, is passed through; a comprehension or generator expression is its function's). The walk takes each call
site once (a loop is walked once: the counts do not grow with the clients, batches or parameters) and consecutive
calls of one frame into the same room are one entry.

A task walks one path, and no path enters a room more than 4 times. A round whose units walk all three paths enters
the rooms every path shares more often: the hubs of :data:`HUBS`, each at most as often as measured there
(docs/design.md says why they are hubs); any other room at most 4 times.
"""

import collections
import sys

import pytest
import torch

from hasfl_ray.data.base import TensorFederatedDataset
from hasfl_ray.models import build_model
from hasfl_ray.training.task import ClientTask, OptimizerSettings
from hasfl_ray.training.trainer import Trainer

#: Most entries of a room that is not a hub.
MOST_ENTRIES = 4

#: Rooms a round of every path enters more often, with their measured counts: the task (the client's objective
#: hooks each path calls: setup, loss, finish in eager; gradient_terms, finish_params in batched; with_faults around
#: every unit, and the result it builds), the workspace (the device state every path starts and ends with: begin,
#: model_at, starting_point, client_generator, client_batches, packed_update) and the local SGD step (built, stepped
#: and, one at a time, zeroed per path).
HUBS = {"hasfl_ray.training.task": 8, "hasfl_ray.training.workspace": 7, "hasfl_ray.training.step": 6}

SIZES = [40, 33, 17, 5]
INLINE = {"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"}


def module(frame):
    return frame.f_globals.get("__name__", "")


def ours(frame):
    return module(frame) == "hasfl_ray" or module(frame).startswith("hasfl_ray.")


def walk(run):
    """The rooms ``run()`` enters, in order: (caller module, entered module, function) per entry."""
    seen, last, entries = set(), {}, []

    def caller_of(frame):
        caller = frame.f_back
        while caller is not None and not ours(caller):
            caller = caller.f_back
        if caller is None:
            return frame.f_back, frame.f_back.f_lineno, "<outside>"
        line = caller.f_lineno
        while caller.f_code.co_name in INLINE and caller.f_back is not None and \
                module(caller.f_back) == module(caller):
            caller = caller.f_back
        return caller, line, module(caller)

    def profile(frame, event, arg):
        if event != "call" or not ours(frame):
            return
        caller, line, caller_module = caller_of(frame)
        room = module(frame)
        if caller_module == room:
            return
        site = (caller.f_code, line, frame.f_code)
        if site in seen:
            return
        seen.add(site)
        if last.get(id(caller)) == (caller, room):
            return
        last[id(caller)] = (caller, room)
        entries.append((caller_module, room, frame.f_code.co_name))

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(previous)
    return entries


@pytest.fixture(scope="module")
def round_inputs():
    torch.manual_seed(0)
    n = sum(SIZES)
    x = torch.randint(0, 256, (n, 1, 8, 8), dtype=torch.uint8)
    y = torch.randint(0, 10, (n,))
    dataset = TensorFederatedDataset("digits", "digits", 10, x, y, x[:8], y[:8], list(torch.arange(n).split(SIZES)),
                                     mean=[0.5], std=[0.25])
    settings = OptimizerSettings(momentum=0.9, weight_decay=1e-4, clip_norm=1.0, local_epochs=1, batch_size=16)
    params = {k: v.detach().clone() for k, v in build_model("digits").named_parameters()}
    return dataset, settings, params


def T(client, width):
    return ClientTask(client, 1, width, 0.05, 7)


#: One round's units by the path they take: (batching, tasks) per train_group call, and whether CUDA graphs are on
#: (on a CPU their static-buffer steps run eagerly).
PATHS = {
    "eager": (False, [("on", [T(1, 0.25)])]),
    "eager, graphed": (True, [("on", [T(1, 0.25)])]),
    "batched": (False, [("on", [T(0, 0.5), T(2, 0.5)])]),
    "mixed": (False, [("mixed", [T(0, 0.5), T(1, 0.25)])]),
}
#: A round walking all three paths: two clients of one width and one alone, then a mixed-width unit.
ROUND = (False, [("on", [T(0, 0.5), T(1, 0.25), T(2, 0.5)]), ("mixed", [T(0, 0.5), T(1, 0.25), T(3, 1.0)])])


def train_group_walk(inputs, path):
    dataset, settings, params = inputs
    cuda_graphs, calls = path
    trainer = Trainer(dataset, "digits", settings, cuda_graphs=cuda_graphs)

    def run():
        for batching, tasks in calls:
            trainer.train_group(tasks, params, batching=batching)

    entries = walk(run)
    walked = "\n".join(f"{a} -> {b}.{f}" for a, b, f in entries)
    return collections.Counter(room for _, room, _ in entries), walked


@pytest.mark.parametrize("path", list(PATHS))
def test_a_task_walking_any_path_enters_no_room_more_than_four_times(round_inputs, path):
    counts, walked = train_group_walk(round_inputs, PATHS[path])
    assert max(counts.values()) <= MOST_ENTRIES, (dict(counts), walked)


def test_a_round_walking_every_path_enters_only_the_hubs_more_than_four_times(round_inputs):
    counts, walked = train_group_walk(round_inputs, ROUND)
    assert {"hasfl_ray.training.eager", "hasfl_ray.training.batched", "hasfl_ray.training.mixed"} <= set(counts)
    over = {room: count for room, count in counts.items() if count > MOST_ENTRIES}
    assert set(over) <= set(HUBS), (dict(counts), walked)
    assert all(over.get(room, 0) <= most for room, most in HUBS.items()), (dict(counts), walked)


def test_the_walk_counts_entries_not_calls():
    """Calls inside a room, repeated call sites (loops) and consecutive calls of one frame into one room are one
    entry; a call back into a room (a callback) is another."""
    import hasfl_ray.training.task as task_module
    from hasfl_ray.models.slicing import width_channels

    def run():
        for _ in range(3):
            [width_channels(0.5, c) for c in (4, 8)]
        task_module.with_faults([], lambda: [])

    entries = walk(run)
    assert [(room, function) for _, room, function in entries] == [
        ("hasfl_ray.models.slicing", "width_channels"), ("hasfl_ray.training.task", "with_faults")]
