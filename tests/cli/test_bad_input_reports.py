"""The bad-input battery of `report`, `plot`, `analyze` and the LEAF reader (issue 24 rows 7, 19, 20 and 23): a run
is counted once however many paths reach it; a bad --out, a read-only place, a corrupt or hostile file of a run
directory, a sweep.json or a LEAF file, or JSON nested too deeply is one sentence with no traceback and nothing
written; reading a run directory never imports code."""

import errno
import json
import os

import pytest

from sentences import invoke, refused

#: JSON nested deeper than Python's parser can recurse (a RecursionError before the fix).
DEEP_JSON = "[" * 200000 + "]" * 200000


def listing(root="."):
    return sorted(os.path.join(d, f) for d, dirs, files in os.walk(root) for f in files + dirs)


def write(path, text):
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


# ------------------------------------------------------------------------------------------ row 7: counted once

def test_a_run_is_counted_once_through_a_link_a_loop_and_overlapping_paths(run):
    # issue 24 row 7: `latest` link, a link loop inside the run, and PATHS that overlap
    os.symlink("run-a", "runs/latest")
    os.symlink("..", os.path.join(run, "loop"))
    result = invoke("report", "runs", run, "runs/latest", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [row["seeds"] for row in data["table"]] == [[42]]
    assert [row["run"] for row in data["confound"]] == [run]  # the name it has without a link
    assert [(row["seeds"], row["n_clients"]) for row in data["pooled"]] == [([42], 6)]
    result = invoke("analyze", "runs/latest", "runs", "--json")
    assert result.exit_code == 0, result.output
    pooled = json.loads(result.output)["pooled"]
    assert [(row["seeds"], row["runs"], row["n_clients"]) for row in pooled] == [([42], ["runs/latest"], 6)]


def test_runs_behind_links_are_still_found(run, tmp_path):
    # issue 24 row 7: a folder of links to runs kept elsewhere is read (links are followed), each run once
    os.makedirs("picked")
    os.symlink(os.path.abspath(run), "picked/best")
    os.symlink(os.path.abspath(run), "picked/again")
    result = invoke("report", "picked", "--json")
    assert result.exit_code == 0, result.output
    assert [row["seeds"] for row in json.loads(result.output)["table"]] == [[42]]


# ------------------------------------------------------------------------------------------ row 19: --out

BAD_OUTS = [("FILE", "is a file"), ("/dev/full", "is a device; expected a folder"), ("/proc/x", "cannot be made"), ("", "is ''")]


@pytest.mark.parametrize("command", ["report", "plot"])
@pytest.mark.parametrize("out, words", BAD_OUTS, ids=[o or "empty" for o, _ in BAD_OUTS])
def test_a_bad_out_is_one_sentence(run, command, out, words):
    # issue 24 row 19: report --out / plot --out checked like simulate's
    if out.startswith("/proc") and not os.path.isdir("/proc/self"):
        pytest.skip("no /proc on this system")
    write("FILE", "mine")
    before = listing()
    refused(invoke(command, run, "--out", out), "output folder", words)
    assert listing() == before and open("FILE").read() == "mine"


@pytest.fixture
def read_only(monkeypatch):
    """Every folder as a read-only mount looks to the writability probe (a trial folder cannot be made): root
    writes through permission bits, so a chmod would not do."""
    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("hasfl_ray.engine.rundir.tempfile.mkdtemp", refuse)


@pytest.mark.parametrize("command", ["report", "plot"])
def test_an_out_on_a_read_only_mount_is_one_sentence(run, read_only, command):
    # issue 24 row 19
    os.makedirs("ro")
    before = listing()
    refused(invoke(command, run, "--out", "ro"), "output folder 'ro' cannot be written", "Read-only file system")
    assert listing() == before


def test_analyze_of_a_read_only_run_is_one_sentence_and_changes_nothing(run, read_only):
    # issue 24 row 19: analyze writes summary.json into the run: checked before anything is printed or written
    summary = open(os.path.join(run, "summary.json"), "rb").read()
    refused(invoke("analyze", run), f"run directory '{run}' cannot be written", "Read-only file system", "analyze")
    assert open(os.path.join(run, "summary.json"), "rb").read() == summary


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_write_that_fails_after_the_check_is_one_sentence(run, monkeypatch):
    # issue 24 row 19: the disk fills after --out was checked: exit 1 (a run error), one sentence
    monkeypatch.setattr("hasfl_ray.analysis.write.atomic_write", full_disk)
    refused(invoke("report", run, "--out", "rep"), "output folder 'rep' could not be written", "No space left",
            status=1)
    monkeypatch.setattr("hasfl_ray.analysis.report.atomic_write", full_disk)
    summary = open(os.path.join(run, "summary.json"), "rb").read()
    result = invoke("analyze", run)
    assert "verdict" in result.output  # the analysis is shown before the write that failed
    assert result.exit_code == 1 and result.output.strip().splitlines()[-1].startswith("Error: summary.json of run")
    assert "Traceback" not in result.output and open(os.path.join(run, "summary.json"), "rb").read() == summary


# ------------------------------------------------------------------------------ rows 20 and 23: the run's files

CONFIG_WITHOUT_DATASET = "config_version: 2\nalgorithm: hasfl\nseed: 42\n"
BAD_FILES = [  # (file in the run, its content, command, words of the sentence)
    ("summary.json", "[]", "report", ["run file 'runs/run-a/summary.json' is a JSON list, not an object"]),
    ("summary.json", "{}", "report", ["summary.json' has no best_accuracy"]),
    ("summary.json", '{"best_accuracy": "high", "final_accuracy": 0.5, "avg_p": 0.5}', "analyze",
     ["has best_accuracy 'high'; expected a number"]),
    ("summary.json", '{"best_accuracy": 0.5, "final_accuracy": 0.5, "avg_p": 0.5, "coverage_warning": 3}', "report",
     ["has coverage_warning 3"]),
    ("summary.json", "not json{", "plot", ["summary.json' is not valid JSON (Expecting value: line 1 column 1"]),
    ("summary.json", DEEP_JSON, "report", ["summary.json' is not valid JSON (nested too deeply"]),  # row 23
    ("clients.csv", "client,num_samples,p_max,tv_distance,h_tilde,p_final,name\n0,10,0.5,0.1,garbage,0.5,a\n",
     "analyze", ["clients.csv' line 2 has h_tilde 'garbage'; expected a finite number"]),
    ("clients.csv", "client,p_final\n0,0.5\n", "report", ["clients.csv' line 2 has no p_max"]),
    ("config.yaml", CONFIG_WITHOUT_DATASET, "report", ["config.yaml' has no dataset"]),
    ("config.yaml", CONFIG_WITHOUT_DATASET.replace("seed: 42", "dataset: digits\nseed: [1, 2]"), "plot",
     ["config.yaml' has seed [1, 2]; expected a whole number"]),
    ("config.yaml", "- just\n- a list\n", "analyze", ["config.yaml' is list, not a mapping"]),
    ("config.yaml", "a: [unclosed\n", "report", ["config.yaml' is not valid YAML"]),
    ("metrics.jsonl", '{"round": 1, "test_accuracy": 0.5}\ngarbage\n', "plot",
     ["metrics.jsonl' line 2 is not valid JSON"]),
    ("metrics.jsonl", "[1, 2, 3]\n", "plot", ["metrics.jsonl' line 1 is a JSON list, not an object"]),
    ("metrics.jsonl", '{"round": 1, "test_accuracy": "x"}\n', "plot", ["line 1 has test_accuracy 'x'"]),
    ("metrics.jsonl", DEEP_JSON, "plot", ["line 1 is not valid JSON (nested too deeply"]),  # row 23
    ("metrics.jsonl", None, "plot", ["run directory 'runs/run-a' has no metrics.jsonl"]),
    ("metrics.jsonl", "[1]\n", "report", ["line 1 is a JSON list"]),  # report --out draws the figures too
]


@pytest.mark.parametrize("name, content, command, words", BAD_FILES,
                         ids=[f"{c}-{n}-{(t or 'missing')[:12]}" for n, t, c, _ in BAD_FILES])
def test_a_bad_file_of_a_run_is_one_sentence_naming_it(run, name, content, command, words):
    # issue 24 rows 20 and 23: report / plot / analyze trust nothing in a run's files
    path = os.path.join(run, name)
    os.remove(path)
    if content is not None:
        write(path, content)
    before = listing()
    refused(invoke(command, run, "--out", "out") if command in ("report", "plot") else invoke(command, run), *words)
    assert listing() == before  # no figure, no table, no analysis block


@pytest.mark.parametrize("name, command", [("summary.json", "report"), ("metrics.jsonl", "plot")])
def test_a_fifo_in_a_run_is_refused_without_waiting(run, name, command):
    # issue 24 row 20 (a cousin of row 17): a FIFO where a run file should be does not hang the reader
    os.remove(os.path.join(run, name))
    os.mkfifo(os.path.join(run, name))
    refused(invoke(command, run, "--out", "out"), f"'{run}/{name}' is a FIFO; expected a regular file")


def test_reading_a_run_never_imports_the_plug_in_its_config_names(run):
    # issue 24 row 20: a stored config.yaml naming a plug-in file is data; the file is never imported
    write("evil.py", "open('IMPORTED', 'w').write('code ran')\nfrom hasfl_ray.algorithms.base import Algorithm\n"
                     "class Evil(Algorithm):\n    pass\n")
    config = os.path.join(run, "config.yaml")
    text = open(config).read().replace("algorithm: hasfl", "algorithm: evil.py:Evil")
    assert "evil.py:Evil" in text
    write(config, text)
    for args in (["report", run, "--json"], ["analyze", run, "--json"], ["plot", run, "--out", "figs"]):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
    assert not os.path.exists("IMPORTED")


SWEEPS = [('{"algorithms": 5}', "has algorithms 5; expected a list of names"),
          ('{"algorithms": ["hasfl", {"a": 1}]}', "has algorithms"),
          ('{"reproduces": ["x"]}', "has reproduces ['x']; expected text"),
          ("[]", "is a JSON list, not an object"),
          ("{", "is not valid JSON (Expecting property name"),
          (DEEP_JSON, "is not valid JSON (nested too deeply")]  # row 23


@pytest.mark.parametrize("content, words", SWEEPS, ids=[c[:16] for c, _ in SWEEPS])
def test_a_bad_sweep_json_is_one_sentence(run, content, words):
    # issue 24 rows 20 and 23: `report OUT` of a sweep's folder reads OUT/sweep.json
    write("runs/sweep.json", content)
    before = listing()
    refused(invoke("report", "runs"), "sweep file 'runs/sweep.json'", words)
    assert listing() == before  # no runs/report folder


# ---------------------------------------------------------------------------------------- row 23: LEAF files

LEAF = [(DEEP_JSON, "is not valid LEAF JSON (nested too deeply to read)"),
        ('{"users": [[1]], "user_data": {}}', "user [1] of its users list is not a name"),
        ('{"users": [1], "user_data": {"1": {"x": [], "y": []}}}', "user 1 of its users list is not a name"),
        ('{"users": ["a", "a"], "user_data": {"a": {"x": [], "y": []}}}', "user 'a' of its users list is listed "
                                                                           "twice")]


@pytest.mark.parametrize("content, words", LEAF, ids=["deep", "list-name", "number-name", "twice"])
def test_a_bad_leaf_file_is_one_sentence_in_data_inspect(tmp_path, monkeypatch, content, words):
    # issue 24 row 23
    monkeypatch.chdir(tmp_path)
    os.makedirs("D")
    write("D/all_data.json", content)
    refused(invoke("data", "inspect", "--dataset", "shakespeare", "--data-dir", "D", "--clients", "1"),
            "D/all_data.json", words, "--data-dir")


def test_deeply_nested_leaf_json_is_one_sentence_in_simulate_and_no_run_directory(tmp_path, monkeypatch):
    # issue 24 row 23
    monkeypatch.chdir(tmp_path)
    os.makedirs("D")
    write("D/all_data.json", DEEP_JSON)
    refused(invoke("simulate", "--backend", "local", "--quiet", "--dataset", "shakespeare", "--data-dir", "D",
                   "--out", "sh"), "D/all_data.json is not valid LEAF JSON (nested too deeply to read)")
    assert not os.path.exists("sh")


def test_a_leaf_fifo_is_refused_without_waiting(tmp_path, monkeypatch):
    # issue 24 row 23 (a cousin of row 17): the LEAF reader refuses a FIFO before reading it
    monkeypatch.chdir(tmp_path)
    os.makedirs("D")
    os.mkfifo("D/all_data.json")
    refused(invoke("data", "inspect", "--dataset", "shakespeare", "--data-dir", "D"),
            "LEAF file 'D/all_data.json' is a FIFO")
