"""Sweeps and the reuse of sibling runs as careful as `simulate` (issue 24): reading a run directory never imports
code, cells never leave --out, a reused run is copied whole or not at all and never through a link, a corrupt
summary.json or sweep.json is named in one sentence, malformed sweep blocks and outputs are one sentence."""

import errno
import json
import logging
import os
import shutil

import pytest
import yaml
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from sweep_files import cells, sha

CELL = "digits-hasfl-seed42"
TINY = {"rounds": 2, "clients": 6, "clients_per_round": 3}


def write_sweep(path, block=None, **shared):
    path.write_text(yaml.safe_dump({"sweep": block or {"algorithms": ["hasfl"], "seeds": [42]}, **TINY, **shared}))
    return str(path)


def sweep(*args):
    return CliRunner().invoke(main, ["sweep", *args, "--backend", "local", "--quiet"], catch_exceptions=False)


def one_sentence(result, *words):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for word in words:
        assert word in result.output, result.output


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished one-cell sweep (runs/theirs), copied by each test that needs one."""
    root = tmp_path_factory.mktemp("finished")
    config = write_sweep(root / "S.yaml")
    result = sweep(config, "--out", str(root / "runs" / "theirs"))
    assert result.exit_code == 0, result.output
    return root


@pytest.fixture
def runs(finished, tmp_path, monkeypatch):
    """tmp_path holding S.yaml and runs/theirs/<CELL> (finished); the working directory."""
    shutil.copytree(finished, tmp_path, dirs_exist_ok=True, symlinks=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ----------------------------------------------------------------------------------------- rows 1-3: reuse, names

def test_reuse_never_imports_a_plugin_named_by_a_neighbouring_run(runs):
    # issue 24 row 1: the reuse scan compares a sibling's config as data; its plug-in file is never imported
    evil = runs / "runs" / "theirs" / CELL
    (evil / "evil.py").write_text(f"open({str(runs / 'PWNED')!r}, 'w').write('x')\n"
                                  "from hasfl_ray.algorithms.base import Algorithm\n"
                                  "class Evil(Algorithm):\n    pass\n")
    config = evil / "config.yaml"
    config.write_text(config.read_text().replace("algorithm: hasfl\n", f"algorithm: {evil}/evil.py:Evil\n"))
    result = sweep("S.yaml", "--out", "runs/mine")
    assert result.exit_code == 0, result.output
    assert not (runs / "PWNED").exists()
    assert cells("runs/mine") == {CELL: "done"}  # not the same config: run, not copied


@pytest.mark.parametrize("name", ["x/../../../../../ESCAPED", "..", "/tmp/hasfl-escaped"])
def test_a_variant_name_that_is_a_path_is_refused(tmp_path, monkeypatch, name):
    # issue 24 row 2: a variant names run directories under --out; a '/' or '..' would leave it
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    config = write_sweep(deep / "S.yaml", {"algorithms": [name], "variants": {name: {"algorithm": "hasfl"}}})
    result = sweep(config, "--out", "o")
    one_sentence(result, f"sweep variant {name!r}", "expected a plain name")
    assert sorted(os.listdir(tmp_path)) == ["a"] and os.listdir(deep) == ["S.yaml"]


def test_a_cell_folder_that_is_a_link_is_refused(runs, tmp_path_factory):
    # issue 24 row 2 (cousin): a cell folder that links elsewhere would put the run outside --out
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    os.makedirs("runs/mine")
    os.symlink(elsewhere, os.path.join("runs", "mine", CELL))
    one_sentence(sweep("S.yaml", "--out", "runs/mine"), "is a link to", "never followed")
    assert os.listdir(elsewhere) == []


def test_reuse_copies_only_what_a_run_writes_never_through_a_link(runs, tmp_path_factory):
    # issue 24 row 3: foreign entries and links in the sibling stay behind (a link to /dev/zero filled the disk:
    # here a link to a small file elsewhere stands for it, so a regression cannot fill the test machine's disk)
    theirs = runs / "runs" / "theirs" / CELL
    secret = tmp_path_factory.mktemp("elsewhere") / "secret.txt"
    secret.write_text("not the run's")
    os.symlink(secret, theirs / "notes.txt")
    os.symlink(secret, theirs / "host")
    os.symlink(secret, theirs / "events" / "linked")
    (theirs / "mine.txt").write_text("a user's file")
    (theirs / "events" / "NOTES.txt").write_text("a user's file among the run's events")
    result = sweep("S.yaml", "--out", "runs/mine")
    assert result.exit_code == 0, result.output
    assert cells("runs/mine") == {CELL: "reused"}
    mine = runs / "runs" / "mine" / CELL
    assert sorted(os.listdir(mine)) == ["clients.csv", "config.yaml", "events", "log.txt", "metrics.csv",
                                        "metrics.jsonl", "summary.json"]
    events = os.listdir(mine / "events")
    assert events and all(name.startswith("events.out.tfevents.") for name in events), events
    assert not any(p.is_symlink() for p in mine.rglob("*"))
    assert sha(mine) == sha(theirs) and oct(os.stat(mine).st_mode & 0o777) == oct(os.stat(theirs).st_mode & 0o777)


def test_a_sibling_whose_run_file_is_a_link_is_not_reused(runs):
    # issue 24 row 3: a run file that is a link makes the sibling no run to copy; the cell runs instead
    theirs = runs / "runs" / "theirs" / CELL
    os.unlink(theirs / "metrics.jsonl")
    os.symlink("/etc/hostname", theirs / "metrics.jsonl")
    result = sweep("S.yaml", "--out", "runs/mine")
    assert result.exit_code == 0, result.output
    assert cells("runs/mine") == {CELL: "done"}
    assert not os.path.islink(runs / "runs" / "mine" / CELL / "metrics.jsonl")


def test_a_copy_that_fails_leaves_no_half_cell(runs, monkeypatch, caplog):
    # issue 24 row 3: a full disk mid-copy leaves nothing behind (one warning) and the cell runs instead
    from hasfl_ray.sweep import state

    real, copied = state._copy_regular, []

    def full_disk(source, target):
        if copied:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        copied.append(source)
        real(source, target)

    monkeypatch.setattr(state, "_copy_regular", full_disk)
    with caplog.at_level(logging.WARNING):
        result = sweep("S.yaml", "--out", "runs/mine")
    assert result.exit_code == 0, result.output
    assert cells("runs/mine") == {CELL: "done"}
    assert "could not be copied" in caplog.text and "No space left on device" in caplog.text
    assert sorted(os.listdir("runs/mine")) == [CELL, "sweep.json"]  # no temporary folder left
    assert sha(runs / "runs" / "mine" / CELL) == sha(runs / "runs" / "theirs" / CELL)


# ------------------------------------------------------------------------------ row 13: keys that cannot apply

@pytest.mark.parametrize("block, shared, words", [
    ({"algorithms": ["hv"], "variants": {"hv": {"algorithm": "hasfl", "seed": 7}}}, {},
     ["seed 7 in sweep.variants.hv", "sweep.seeds"]),
    ({"algorithms": ["hv"], "variants": {"hv": {"algorithm": "hasfl", "dataset": "synthetic"}}}, {},
     ["dataset 'synthetic' in sweep.variants.hv", "sweep.datasets"]),
    ({"datasets": ["digits"], "per_dataset": {"digits": {"algorithm": "fedavg"}}}, {},
     ["algorithm 'fedavg' in sweep.per_dataset.digits", "sweep.algorithms"]),
    ({"datasets": ["digits"], "per_dataset": {"digits": {"seed": 3}}}, {}, ["seed 3 in sweep.per_dataset.digits"]),
    ({"seeds": [42]}, {"seed": 7}, ["seed 7 and sweep.seeds [42]", "expected one of them"]),
    ({"algorithms": ["hasfl"]}, {"algorithm": "fedavg"}, ["algorithm 'fedavg' and sweep.algorithms"]),
    ({"algorithms": ["hv"], "variants": {"hv": {"algorithm": "hasfl", "actors": 4}}}, {},
     ["actors 4 in sweep.variants.hv", "local backend"]),
    ({"algorithms": ["hv"], "variants": {"hv": {"algorithm": "hasfl", "backend": "ray"}}}, {},
     ["backend 'ray' in sweep.variants.hv"]),
    # h59: a key no flag of the sweep replaces was told to use --backend, --address or --gpus-per-actor instead
    ({"algorithms": ["hv"], "variants": {"hv": {"algorithm": "hasfl", "fault_inject": "trainer-error@1"}}}, {},
     ["fault_inject 'trainer-error@1' in sweep.variants.hv", "expected it left out", "no fault to inject"]),
    ({"algorithms": ["hv"], "variants": {"hv": {"algorithm": "hasfl", "server_placement": "actor"}}}, {},
     ["server_placement 'actor' in sweep.variants.hv", "expected it left out"]),
    ({"algorithms": ["hv"], "variants": {"hv": {"algorithm": "hasfl", "address": "auto"}}}, {},
     ["address 'auto' in sweep.variants.hv", "--address or --gpus-per-actor flags instead"]),
    # issue 37 item 8: an option the variant's own algorithm does not take (was: dropped in silence)
    ({"algorithms": ["hv"], "variants": {"hv": {"algorithm": "hasfl", "mu": 0.5}}}, {},
     ["mu 0.5 in sweep.variants.hv", "algorithm 'hasfl' takes no option 'mu'", "fedprox"]),
    ({"algorithms": ["hv"], "variants": {"hv": {"algorithm": "hasfl", "algorithm_options": {"mu": 0.5}}}}, {},
     ["mu 0.5 in sweep.variants.hv", "takes no option 'mu'"]),
    ({"algorithms": ["hv"], "variants": {"hv": {"mu": 0.5}}}, {}, ["mu 0.5 in sweep.variants.hv", "'hasfl'"]),
    ({"algorithms": ["fv"], "variants": {"fv": {"algorithm": "fedavg", "coverage": False}}}, {},
     ["coverage False in sweep.variants.fv", "'fedavg' takes no option 'coverage'", "hasfl or random-budget"]),
])
def test_a_key_that_cannot_apply_to_a_cell_is_refused_by_name(tmp_path, block, shared, words):
    # issue 24 row 13: a variant's seed/dataset (anything the sweep sets for each cell) was dropped in silence
    config = write_sweep(tmp_path / "S.yaml", block, **shared)
    one_sentence(sweep(config, "--out", str(tmp_path / "o")), *words)
    assert not (tmp_path / "o").exists()


def test_a_variants_option_is_refused_by_simulate_config_too_and_taken_where_it_applies(tmp_path, monkeypatch):
    """issue 37 item 8: the one reader of the sweep block (split_sweep_config) refuses it, for simulate --config
    as for sweep; a shared ``mu`` still applies to the fedprox cells only, and a fedprox variant takes its own."""
    monkeypatch.chdir(tmp_path)
    config = write_sweep(tmp_path / "S.yaml", {"algorithms": ["hv"], "variants": {"hv": {"algorithm": "hasfl",
                                                                                         "mu": 0.5}}})
    result = CliRunner().invoke(main, ["simulate", "--config", config, "--algorithm", "hv", "--out", "o"])
    one_sentence(result, "mu 0.5 in sweep.variants.hv", "takes no option 'mu'")
    assert not os.path.exists("o")
    from hasfl_ray.sweep import plan_sweep

    fine = write_sweep(tmp_path / "F.yaml", {"algorithms": ["hasfl", "fedprox", "prox1"],
                                             "variants": {"prox1": {"algorithm": "fedprox", "mu": 1.0}}}, mu=0.1)
    planned = {c.algorithm: c.values for c in plan_sweep(fine, {}).cells}
    assert planned["prox1"]["mu"] == 1.0 and planned["fedprox"]["mu"] == 0.1


# ----------------------------------------------------------------------------------------- rows 19, 29: --out

@pytest.mark.parametrize("out, words", [
    ("FILE", ["sweep folder 'FILE' is a file"]),
    ("FILE/sub", ["sweep folder 'FILE/sub' cannot be made", "is a file"]),
    ("/dev/full", ["sweep folder '/dev/full' is a device"]),
    ("/proc/hasfl-ray-sweep", ["sweep folder '/proc/hasfl-ray-sweep' cannot be made in '/proc'"]),
    ("", ["--out is ''", "expected a folder path"]),
    ("  ", ["--out is '  '", "expected a folder path"]),
])
def test_sweep_out_is_checked_like_simulates(tmp_path, monkeypatch, out, words):
    # issue 24 rows 19 and 29: a file, a device, /proc, '' (was: runs/<config name> in silence) are one sentence
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("a file")
    config = write_sweep(tmp_path / "S.yaml")
    one_sentence(sweep(config, "--out", out), *words)
    assert sorted(os.listdir(tmp_path)) == ["FILE", "S.yaml"]


def test_sweep_out_in_a_read_only_folder_is_one_sentence(tmp_path, monkeypatch):
    # issue 24 row 19: a read-only mount, as the writability probe sees it (root writes through permission bits,
    # so a chmod would not do): the trial folder cannot be made
    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("hasfl_ray.engine.rundir.tempfile.mkdtemp", refuse)
    (tmp_path / "ro").mkdir()
    one_sentence(sweep(write_sweep(tmp_path / "S.yaml"), "--out", str(tmp_path / "ro" / "o")), "cannot be made",
                 "Read-only file system")
    assert os.listdir(tmp_path / "ro") == []


# ---------------------------------------------------------------------------- row 21: a corrupt summary.json

@pytest.mark.parametrize("text", ["", "not json{", "[1, 2]", "[" * 100000 + "]" * 100000])
def test_a_finished_cell_with_a_corrupt_summary_runs_again(runs, caplog, text):
    # issue 24 row 21: was a JSONDecodeError traceback on every rerun; now one warning naming the file, and the
    # cell resumes from its checkpoint (bit-identical)
    out = os.path.join("runs", "theirs")
    before = sha(os.path.join(out, CELL))
    summary = os.path.join(out, CELL, "summary.json")
    with open(summary, "w", encoding="utf-8") as handle:
        handle.write(text)
    with caplog.at_level(logging.WARNING):
        result = sweep("S.yaml", "--out", out)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and cells(out) == {CELL: "resumed"}
    assert f"summary.json of the finished cell {summary!r}" in caplog.text and "runs again" in caplog.text
    assert sha(os.path.join(out, CELL)) == before


@pytest.mark.parametrize("digest", [None, "x", 42, "AB" * 32])
def test_a_finished_cell_whose_summary_lacks_params_sha256_runs_again(runs, caplog, digest):
    # battery 5's smaller notes (A131): a summary.json without params_sha256 (or a malformed one) was skipped as a
    # finished cell; every finished run writes it, so the cell resumes from its checkpoint (bit-identical) and a
    # sibling sweep does not reuse it
    out = os.path.join("runs", "theirs")
    before = sha(os.path.join(out, CELL))
    summary_file = os.path.join(out, CELL, "summary.json")
    with open(summary_file, encoding="utf-8") as handle:
        summary = json.load(handle)
    summary.pop("params_sha256")
    if digest is not None:
        summary["params_sha256"] = digest
    with open(summary_file, "w", encoding="utf-8") as handle:
        json.dump(summary, handle)
    with caplog.at_level(logging.WARNING):
        assert sweep("S.yaml", "--out", "runs/mine").exit_code == 0
        assert cells("runs/mine") == {CELL: "done"}  # not reused
        result = sweep("S.yaml", "--out", out)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and cells(out) == {CELL: "resumed"}
    assert f"summary.json of the finished cell {summary_file!r}" in caplog.text and "runs again" in caplog.text
    assert ("has no params_sha256" if digest is None else "expected the 64 hexadecimal digits") in caplog.text
    assert sha(os.path.join(out, CELL)) == before == sha(os.path.join("runs", "mine", CELL))


def test_a_corrupt_summary_of_the_cell_random_budget_takes_its_budget_from(tmp_path, monkeypatch):
    # issue 24 row 21 (cousin): the random-budget cell's check read its HAS-FL cell's corrupt summary.json before
    # anything ran (the sweep could not go on); now the HAS-FL cell runs again first and the budget comes after
    monkeypatch.chdir(tmp_path)
    config = write_sweep(tmp_path / "R.yaml", {"algorithms": ["hasfl", "random-budget"], "seeds": [42]}, warmup=1,
                         t_adapt=1)
    assert sweep(config, "--out", "o").exit_code == 0
    hasfl = os.path.join("o", CELL)
    before = sha(hasfl)
    with open(os.path.join(hasfl, "summary.json"), "w", encoding="utf-8") as handle:
        handle.write("not json{")
    result = sweep(config, "--out", "o")
    assert result.exit_code == 0, result.output
    assert cells("o") == {CELL: "resumed", "digits-random-budget-seed42": "skipped"} and sha(hasfl) == before


def test_a_sibling_with_a_corrupt_summary_is_not_reused(runs, caplog):
    # issue 24 row 21: a sibling sweep's same-config cell with `not json{`: named in one warning, passed over
    summary = os.path.join("runs", "theirs", CELL, "summary.json")
    with open(summary, "w", encoding="utf-8") as handle:
        handle.write("not json{")
    with caplog.at_level(logging.WARNING):
        result = sweep("S.yaml", "--out", "runs/mine")
    assert result.exit_code == 0, result.output
    assert cells("runs/mine") == {CELL: "done"}
    assert f"summary.json of the finished run {os.path.abspath(summary)!r} is not valid JSON" in caplog.text
    assert "not reused" in caplog.text


# --------------------------------------------------------------------------- row 22: malformed sweep blocks

@pytest.mark.parametrize("block, words", [
    ({"algorithms": [{"a": 1}]}, ["{'a': 1} in sweep.algorithms", "algorithm names"]),
    ({"datasets": [["digits"]]}, ["['digits'] in sweep.datasets", "dataset names"]),
    ({"algorithms": [""]}, ["'' in sweep.algorithms"]),
    ({"seeds": [True]}, ["seed True in sweep.seeds", "non-negative integers"]),
    ({"seeds": [{"a": 1}]}, ["seed {'a': 1} in sweep.seeds"]),
    ({"seeds": 4.5}, ["sweep.seeds 4.5", "non-empty list"]),
    ({"out": 5}, ["sweep.out 5", "folder path"]),
    ({"out": ["a", "b"]}, ["sweep.out ['a', 'b']", "folder path"]),
    ({"out": ""}, ["sweep.out ''", "folder path"]),
])
def test_malformed_sweep_block_values_are_one_sentence(tmp_path, monkeypatch, block, words):
    # issue 24 row 22: was a TypeError traceback
    monkeypatch.chdir(tmp_path)
    config = write_sweep(tmp_path / "S.yaml", block)
    one_sentence(CliRunner().invoke(main, ["sweep", config, "--backend", "local", "--quiet"],
                                    catch_exceptions=False), *words)
    assert os.listdir(tmp_path) == ["S.yaml"]


def test_simulate_config_reads_the_same_sweep_block(tmp_path):
    # issue 24 row 22 (cousin): `simulate --config` reads the sweep block with the same readers
    config = write_sweep(tmp_path / "S.yaml", {"algorithms": [{"a": 1}]})
    result = CliRunner().invoke(main, ["simulate", "--config", config, "--backend", "local", "--quiet", "--out",
                                       str(tmp_path / "o")], catch_exceptions=False)
    one_sentence(result, "{'a': 1} in sweep.algorithms")


# ------------------------------------------------------------------------------- row 23: a corrupt sweep.json

@pytest.mark.parametrize("text", ["[" * 200000 + "]" * 200000, '{"cells": 5}', "[]", "not json"])
def test_a_corrupt_sweep_json_is_named_and_written_anew(runs, caplog, text):
    # issue 24 row 23: a sweep.json nested too deeply (was a RecursionError traceback), or not a sweep's
    out = os.path.join("runs", "theirs")
    path = os.path.join(out, "sweep.json")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    with caplog.at_level(logging.WARNING):
        result = sweep("S.yaml", "--out", out)
    assert result.exit_code == 0, result.output
    assert f"sweep.json of the sweep folder {path!r}" in caplog.text and "written anew" in caplog.text
    assert cells(out) == {CELL: "skipped"}


def test_a_budget_from_summary_nested_too_deeply_is_one_sentence(runs):
    # issue 24 rows 21 and 23 (cousin): random-budget's budget_from read a summary.json with json.load (a
    # RecursionError traceback for deep nesting); now the same careful reader as the sweep's
    summary = os.path.join("runs", "theirs", CELL, "summary.json")
    with open(summary, "w", encoding="utf-8") as handle:
        handle.write("[" * 100000 + "]" * 100000)
    result = CliRunner().invoke(main, ["simulate", "--algorithm", "random-budget", "--budget-from",
                                       os.path.join("runs", "theirs", CELL), "--backend", "local", "--quiet",
                                       "--out", "rb", *[f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]],
                                catch_exceptions=False)
    one_sentence(result, "budget_from file", "nested too deeply")
    assert not os.path.exists("rb")


def test_odd_cells_of_an_earlier_sweep_json_are_left_out_and_the_others_kept(runs):
    # issue 24 row 23 (cousin): entries that are not cells (a number, a name that is a list: unhashable, was a
    # TypeError) are left out; an earlier sweep's real cell is kept
    out = os.path.join("runs", "theirs")
    with open(os.path.join(out, "sweep.json"), "w", encoding="utf-8") as handle:
        json.dump({"cells": [5, {"name": ["x"]}, {"name": "digits-fedavg-seed7", "status": "done"}]}, handle)
    result = sweep("S.yaml", "--out", out)
    assert result.exit_code == 0, result.output
    assert cells(out) == {"digits-fedavg-seed7": "done", CELL: "skipped"}
