"""The reproduction packs (configs/pack-*.yaml, docs/reproduction/packs.md): every cell of every pack builds a valid
RunConfig with the source's protocol, each config states its source's settings and published numbers, and each
pack's scaled-down sweep starts and finishes a round through the CLI (on the embedded digits, 8x8 inputs)."""

import glob
import json
import os
import warnings

import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine import RunConfig
from hasfl_ray.federation import ladder_of
from hasfl_ray.schedule import round_lr
from hasfl_ray.sweep import plan_sweep

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKS = {os.path.basename(p)[len("pack-"):-len(".yaml")]: p
         for p in sorted(glob.glob(os.path.join(REPO, "configs", "pack-*.yaml")))}


def cells(name):
    """{variant: its first cell's resolved RunConfig}."""
    out = {}
    for cell in plan_sweep(PACKS[name], {}).cells:
        out.setdefault(cell.algorithm, RunConfig.from_dict(cell.values, cell.name, foreign="drop").resolved())
    return out


def test_the_four_packs_exist_and_state_their_source():
    assert set(PACKS) == {"heterofl-cifar10", "fjord-cifar10", "fedrolex-cifar10", "fiarse-protocol"}
    for path in PACKS.values():
        text = open(path, encoding="utf-8").read()
        assert text.startswith("# Reproduction pack: "), path
        assert "Published" in text and "settings" in text and "Run: hasfl-ray sweep " + os.path.relpath(path, REPO) \
            in text, path


def test_heterofl_pack_is_the_table():
    """All twelve rows of the authors' table, each with the global model of its first level (HeteroFL's
    global_model_rate): row b-e trains the width-1/2 network, its level-e clients the 1/8 slice of it."""
    configs = cells("heterofl-cifar10")
    levels = {"a": 1.0, "b": 0.5, "c": 0.25, "d": 0.125, "e": 0.0625}  # HeteroFL src/utils.py: model_split_rate
    rows = {(c.partition, c.global_width, tuple(ladder_of(c).widths), c.width_assignment) for c in configs.values()}
    for partition, rounds in (("iid", 400), ("classes:2", 800)):
        for row in ("a", "a-e", "a-b-c-d-e", "b", "b-e", "b-c-d-e", "c", "c-e", "c-d-e", "d", "d-e", "e"):
            rates = [levels[letter] for letter in row.split("-")]
            relative = tuple(r / rates[0] for r in rates)
            assignments = ("dynamic",) if len(rates) > 1 else ("fixed",)
            assignments += ("fixed",) if row in ("a-e", "a-b-c-d-e") else ()
            assert all((partition, rates[0], relative, a) in rows for a in assignments), (partition, row)
        assert {c.rounds for c in configs.values() if c.partition == partition} == {rounds}
    assert len(configs) == 28
    for c in configs.values():
        # the authors' table's network, HeteroFL's PreResNet (1,1,1,2) (tests/models/test_heterofl_network.py)
        assert (c.algorithm, c.model, c.model_norm, c.model_scaler) == ("heterofl", "preresnet18-1112", "sbn", "on")
        assert (c.clients, c.clients_per_round, c.local_epochs, c.batch_size, c.lr) == (100, 10, 5, 10, 0.1)
        assert c.algorithm_options["heterofl_weighting"] == "count"
        assert c.eval_widths == [1.0]  # the global model only, as HeteroFL reports
        # HeteroFL's stats(dataset['train'], ..): the whole training set through the training transform
        assert (c.sbn_statistics, c.sbn_batch_size, c.sbn_statistics_data, c.augmentation) == \
            ("shuffled", 10, "training_set", "crop_flip")


def test_fjord_pack_evaluates_every_p_with_and_without_distillation():
    configs = cells("fjord-cifar10")
    # with KD: λ = 1; without: FjORD's OD without KD (the drawn width's cross-entropy alone)
    assert {name: c.algorithm_options["fjord_kd"] for name, c in configs.items()} == {"fjord-kd": True,
                                                                                       "fjord-no-kd": False}
    assert configs["fjord-kd"].algorithm_options["fjord_distill_weight"] == 1.0
    for c in configs.values():
        assert c.algorithm == "fjord" and c.model == "resnet18" and c.model_scaler == "off"
        assert list(ladder_of(c).widths) == [0.2, 0.4, 0.6, 0.8, 1.0] == c.eval_widths
        assert (c.clients, c.clients_per_round, c.rounds, c.partition) == (100, 10, 500, "iid")


def test_fedrolex_pack_compares_rolling_and_static_windows_on_both_mixes():
    configs = cells("fedrolex-cifar10")
    pairs = {(c.algorithm, tuple(c.width_mix)) for c in configs.values()}
    assert pairs == {(a, m) for a in ("fedrolex", "heterofl") for m in ((1.0,) * 5, (6.0, 10.0, 11.0, 18.0, 55.0))}
    for c in configs.values():
        assert (c.partition, c.width_assignment, c.model_norm, c.model_scaler) == ("classes:2", "dynamic", "sbn", "on")
        assert (c.clients, c.clients_per_round) == (100, 10)
        # each client counted once in both cells, as FedRolex's combine (resnet_server.py, weighting avg: K = 1)
        assert c.aggregation_weights == "count"


def test_fiarse_pack_runs_four_methods_on_one_protocol():
    configs = cells("fiarse-protocol")
    assert set(configs) == {"fjord", "heterofl", "fedrolex", "hasfl"}
    for c in configs.values():
        assert list(ladder_of(c).widths) == [1.0, 0.5, 0.25, 0.125] and c.width_mix == [1.0] * 4  # sizes 1 .. 1/64
        assert (c.partition, c.alpha, c.model_norm, c.model) == ("balanced-dirichlet", 0.3, "sbn", "resnet18")
        assert (c.local_steps, c.batch_size, c.lr, c.lr_decay, c.momentum, c.weight_decay, c.clip_norm) == \
            (100, 20, 0.1, 1.0, 0.0, 0.0, 0.0)  # FIARSE's plain SGD
        # FIARSE's evaluation (test-batch statistics, --bsz 20) and its client loader's crop-flip
        # (tests/engine/test_source_evaluation.py checks the evaluation against fiarse/utils.py::check_accuracy)
        assert (c.sbn_statistics, c.eval_batch_size, c.augmentation) == ("test_batch", 20, "crop_flip")


def test_heterofl_pack_names_the_round_its_table_reports():
    """HeteroFL's table is each run's best-Global-Accuracy checkpoint re-tested (src/test_classifier_fed.py at
    cc40f3e46b0f: ``resume(..., load_tag='best')``, the checkpoint train_classifier_fed.py keeps by ``pivot_metric``
    Global-Accuracy), so the pack names best_accuracy and that round's local accuracy as the counterparts."""
    text = " ".join(open(PACKS["heterofl-cifar10"], encoding="utf-8").read().split())
    assert "best_accuracy" in text and "--local-eval-every 1" in text and "best round" in text
    page = " ".join(open(os.path.join(REPO, "docs", "reproduction", "packs.md"), encoding="utf-8").read().split())
    assert "`load_tag='best'`" in page and "`best_accuracy`, its local column the local accuracy at that same round" \
        in page and "(`--local-eval-every 1`)" in page


def source_lrs(lr, milestones, gamma, rounds, step_first):
    """The learning rate of each round (0-based) of a source's loop over its global epochs 1..rounds, with a
    torch MultiStepLR stepped once a round: before the round (``step_first``: FedRolex main_resnet.py, commit
    813510997e18: ``scheduler.step()``, then the lr read and the round) or after it (HeteroFL
    src/train_classifier_fed.py, commit cc40f3e46b0f: ``train(...)``, ``test(...)``, then ``scheduler.step()``)."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=lr)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=gamma)
    out = []
    for _ in range(rounds):
        if step_first:
            with warnings.catch_warnings():  # torch warns of exactly this order, FedRolex's
                warnings.simplefilter("ignore", UserWarning)
                scheduler.step()
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        if not step_first:
            scheduler.step()
    return out


def test_the_heterofl_and_fedrolex_packs_step_their_learning_rates_as_their_sources():
    """HeteroFL (src/utils.py, CIFAR10): lr 0.1, x0.1 at [150, 250] IID and [300, 500] non-IID, its scheduler
    stepped after each round; FedRolex (utils.py and its README command): SGD lr 2e-4, momentum 0.9, weight decay
    1e-3, x0.25 at --schedule 1200, its scheduler stepped before each round, so its 1200th round (0-based 1199) is
    the first at lr/4. Every round of every cell trains at the source's rate."""
    for c in cells("heterofl-cifar10").values():
        assert (c.lr, c.lr_decay, c.lr_gamma) == (0.1, 1.0, 0.1)
        assert c.input_normalization == "sources"  # HeteroFL src/data.py's Normalize
        milestones = [300, 500] if c.partition == "classes:2" else [150, 250]
        assert [round_lr(c.lr, c.lr_decay, t, c.lr_milestones, c.lr_gamma) for t in range(c.rounds)] == \
            source_lrs(0.1, milestones, 0.1, c.rounds, step_first=False)
    for c in cells("fedrolex-cifar10").values():
        assert c.input_normalization == "sources"  # FedRolex data.py's Normalize
        assert (c.lr, c.lr_decay, c.lr_gamma, c.momentum, c.weight_decay, c.clip_norm) == \
            (0.0002, 1.0, 0.25, 0.9, 0.001, 1.0)
        assert [round_lr(c.lr, c.lr_decay, t, c.lr_milestones, c.lr_gamma) for t in range(c.rounds)] == \
            source_lrs(2e-4, [1200], 0.25, c.rounds, step_first=True)



def test_every_pack_standardises_its_inputs_with_the_sources_constants():
    """All four sources apply Normalize((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)) to CIFAR-10: HeteroFL
    src/data.py (cc40f3e), FedRolex data.py (8135109), FIARSE data/cifar10/data.py (281519c), Flower
    baselines/fjord/fjord/dataset.py's CIFAR_NORMALIZATION (fdef7afb); every cell of every pack takes them."""
    from hasfl_ray.data.images import SOURCE_NORMALIZATION

    assert SOURCE_NORMALIZATION == ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))
    for name in PACKS:
        assert {c.input_normalization for c in cells(name).values()} == {"sources"}, name

# one variant per pack, scaled down as docs/reproduction/packs.md runs it, on the digits (no data directory needed)
TRIES = {"heterofl-cifar10": "noniid2-b-e-dynamic", "fjord-cifar10": "fjord-no-kd",
         "fedrolex-cifar10": "fedrolex-devices", "fiarse-protocol": "hasfl"}


@pytest.mark.parametrize("name", sorted(TRIES))
def test_each_pack_scaled_down_runs_a_round(name, tmp_path):
    out = str(tmp_path / "sweep")
    result = CliRunner().invoke(main, [
        "sweep", PACKS[name], "--datasets", "digits", "--algorithms", TRIES[name], "--seeds", "42", "--rounds", "1",
        "--clients", "5", "--clients-per-round", "2", "--eval-samples", "64", "--backend", "local", "--out", out,
        "--quiet", *([] if name == "fiarse-protocol" else ["--local-epochs", "1"]),  # FIARSE's local_steps: 100
        # the packs' CIFAR constants have no digits counterpart: the split's own statistics
        "--input-normalization", "split"],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run = os.path.join(out, f"digits-{TRIES[name]}-seed42")
    summary = json.load(open(os.path.join(run, "summary.json"), encoding="utf-8"))
    assert summary["rounds"] == 1 and 0.0 <= summary["final_accuracy"] <= 1.0
    expected = cells(name)[TRIES[name]].eval_widths
    assert sorted(float(w) for w in summary["accuracy_at_width_final"]) == sorted(expected)
    assert summary["local_accuracy"]["clients"] == 5
