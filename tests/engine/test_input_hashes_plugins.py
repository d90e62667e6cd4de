"""Every input known by its content (issue 49 item 4, hostile battery 5's problem 2): a module a plug-in's FILE.py
imports, a ``MODULE:Class`` plug-in, and the data files a dataset plug-in lists in ``data_files()`` are in
``input_sha256``; an edit between a stop and --resume is refused in one sentence naming it, and a sweep beside
does not reuse a cell made from other data. What cannot be known so is said in one sentence (log and summary)."""

import json
import os
import shutil
import sys
import uuid

import yaml
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.config import RunConfig
from hasfl_ray.config.inputs import file_sha256, input_hashes, unverified_inputs

TINY = ["--backend", "local", "--rounds", "2", "--clients", "6", "--clients-per-round", "3", "--quiet"]


def run(*args):
    return CliRunner().invoke(main, list(args))


def refused(result, *words):
    message = result.output.strip()
    assert result.exit_code == 2 and len(message.splitlines()) == 1 and "Traceback" not in message, message
    for word in words:
        assert word in message, (word, message)


def test_a_module_the_plugin_imports_beside_it_is_hashed_and_an_edit_refuses_resume(tmp_path, monkeypatch):
    plug = tmp_path / "plug"
    plug.mkdir()
    wmod = f"wmod_{uuid.uuid4().hex[:8]}"  # a name of its own: no other test's module of that name is cached
    (plug / f"{wmod}.py").write_text("WIDTH = 0.5\n")
    (plug / "halfpol2.py").write_text(f"from {wmod} import WIDTH\nfrom hasfl_ray import Algorithm\n\n\n"
                                      "class Half(Algorithm):\n    def allocate(self, round, participants):\n"
                                      "        return {i: min(float(self.p_max[i]), WIDTH) for i in participants}\n")
    monkeypatch.syspath_prepend(str(plug))
    out = tmp_path / "run"
    first = run("simulate", *TINY, "--algorithm", f"{plug / 'halfpol2.py'}:Half", "--checkpoint-every", "1",
                "--out", str(out))
    assert first.exit_code == 0, first.output
    stored = yaml.safe_load((out / "config.yaml").read_text())["input_sha256"]
    assert stored == {"algorithm": file_sha256(str(plug / "halfpol2.py")),
                      f"algorithm imports {wmod}": file_sha256(str(plug / f"{wmod}.py"))}  # hasfl_ray's: not
    assert run("simulate", "--out", str(out), "--resume", "--quiet").exit_code == 0  # the same files: resumes
    (plug / f"{wmod}.py").write_text("WIDTH = 0.25\n")
    refused(run("simulate", "--out", str(out), "--resume", "--quiet"),
            f"module {wmod!r} that the algorithm imports changed since the run began")
    sys.modules.pop(wmod, None)


def test_a_module_class_plugin_is_hashed_and_an_edit_refuses_resume(tmp_path, monkeypatch):
    name = f"modpol_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("from hasfl_ray import Algorithm\n\n\nclass Mod(Algorithm):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = RunConfig(backend="local", algorithm=f"{name}:Mod").resolved()
    assert config.input_sha256 == {"algorithm": file_sha256(str(tmp_path / f"{name}.py"))}  # was None
    out = tmp_path / "run"
    first = run("simulate", *TINY, "--algorithm", f"{name}:Mod", "--checkpoint-every", "1", "--out", str(out))
    assert first.exit_code == 0, first.output
    with open(tmp_path / f"{name}.py", "a") as handle:
        handle.write("# edited\n")
    refused(run("simulate", "--out", str(out), "--resume", "--quiet"),
            f"algorithm module {name!r} changed since the run began")
    sys.modules.pop(name, None)


def test_a_packages_own_modules_are_followed_through_relative_imports(tmp_path, monkeypatch):
    package = f"pkg_{uuid.uuid4().hex[:8]}"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "widths.py").write_text("WIDTH = 0.5\n")
    (tmp_path / package / "policy.py").write_text("from .widths import WIDTH\nfrom hasfl_ray import Algorithm\n\n\n"
                                                  "class P(Algorithm):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    hashes = RunConfig(backend="local", algorithm=f"{package}.policy:P").resolved().input_sha256
    assert hashes == {"algorithm": file_sha256(str(tmp_path / package / "policy.py")),
                      f"algorithm imports {package}": file_sha256(str(tmp_path / package / "__init__.py")),
                      f"algorithm imports {package}.widths": file_sha256(str(tmp_path / package / "widths.py"))}
    for key in [k for k in sys.modules if k.startswith(package)]:
        sys.modules.pop(key)


def copy_dataset(folder):
    folder.mkdir()
    shutil.copy("examples/my_dataset.py", folder / "my_dataset.py")
    shutil.copy("examples/my_dataset.csv", folder / "my_dataset.csv")
    return f"{folder / 'my_dataset.py'}:MyDataset"


def test_a_dataset_plugins_csv_edited_between_two_sweeps_is_not_reused(tmp_path):
    spec = copy_dataset(tmp_path / "dsw")
    config = RunConfig(backend="local", dataset=spec).resolved()
    csv = str(tmp_path / "dsw" / "my_dataset.csv")
    assert config.input_sha256[f"dataset data {csv}"] == file_sha256(csv) and unverified_inputs(config) is None
    plan = tmp_path / "s.yaml"
    plan.write_text(yaml.safe_dump({"sweep": {"reproduces": "a dataset plug-in's sweep", "datasets": [spec],
                                              "algorithms": ["fedavg"], "seeds": [42]}}))
    args = ["sweep", str(plan), "--backend", "local", "--rounds", "2", "--clients", "6", "--clients-per-round", "3",
            "--quiet"]
    first = run(*args, "--out", str(tmp_path / "runs" / "a"))
    assert first.exit_code == 0, first.output
    lines = (tmp_path / "dsw" / "my_dataset.csv").read_text().splitlines()
    edited = [lines[0]] + [",".join(row.split(",")[:-1] + [str((int(float(row.split(",")[-1])) + 1) % 3)])
                           if i % 2 else row for i, row in enumerate(lines[1:])]
    (tmp_path / "dsw" / "my_dataset.csv").write_text("\n".join(edited) + "\n")
    second = run(*args, "--out", str(tmp_path / "runs" / "b"))
    assert second.exit_code == 0, second.output
    with open(tmp_path / "runs" / "b" / "sweep.json", encoding="utf-8") as handle:
        assert {c["status"] for c in json.load(handle)["cells"]} == {"done"}, second.output  # trained, not reused
    assert "reused the finished run" not in second.output


def test_a_dataset_plugin_that_lists_no_files_is_said_once_in_the_log_and_the_summary(tmp_path, caplog):
    folder = tmp_path / "ds"
    copy_dataset(folder)
    source = (folder / "my_dataset.py").read_text()
    start = source.index("    def data_files")
    (folder / "my_dataset.py").write_text(source[:start] + source[source.index("    def load"):])
    spec = f"{folder / 'my_dataset.py'}:MyDataset"
    config = RunConfig(backend="local", dataset=spec).resolved()
    assert not any(k.startswith("dataset data") for k in config.input_sha256)
    sentence = unverified_inputs(config)
    assert sentence.startswith(f"dataset {spec!r} does not list the files it reads") and sentence.count(". ") == 0
    out = tmp_path / "run"
    result = run("simulate", *TINY, "--dataset", spec, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["inputs_unverified"] == sentence
    assert sentence in (out / "log.txt").read_text()


def test_a_listed_data_file_that_does_not_exist_is_refused(tmp_path):
    folder = tmp_path / "ds"
    copy_dataset(folder)
    source = (folder / "my_dataset.py").read_text().replace("return [config.data_dir or CSV]",
                                                            "return [CSV + '.missing']")
    (folder / "my_dataset.py").write_text(source)
    refused(run("simulate", *TINY, "--dataset", f"{folder / 'my_dataset.py'}:MyDataset", "--out",
                str(tmp_path / "run")), "lists", ".missing' in data_files() but there is no such file or folder")
    assert not (tmp_path / "run").exists()


def test_a_folder_listed_is_known_by_every_file_under_it(tmp_path):
    class Config:
        devices = None
        algorithm = model = "hasfl"
        dataset = "digits"
    assert input_hashes(Config()) is None
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.csv").write_text("1\n")
    (data / "sub" / "b.csv").write_text("2\n")
    from hasfl_ray.config.inputs import folder_sha256
    before = folder_sha256(str(data))
    (data / "sub" / "b.csv").write_text("3\n")
    assert folder_sha256(str(data)) != before
    os.remove(data / "sub" / "b.csv")
    assert folder_sha256(str(data)) not in (before,)


def test_a_run_that_predates_a_kind_of_hash_is_not_refused_for_it_but_any_change_is():
    from hasfl_ray.config.inputs import changed_inputs

    a, b, c = "a" * 64, "b" * 64, "c" * 64
    now = {"algorithm": a, "algorithm imports wmod": b, "dataset": a, "dataset data x.csv": c}
    # written before modules, data files and MODULE:Class plug-ins were hashed: their keys absent, nothing changed
    assert changed_inputs({"algorithm": a, "dataset": a}, now) == []
    assert changed_inputs({}, {"algorithm": a}) == []  # a MODULE:Class run of before (input_sha256: null)
    # its own file changed: reported, and the modules it imports now with it
    assert changed_inputs({"algorithm": c, "dataset": a}, now) == ["algorithm", "algorithm imports wmod"]
    assert changed_inputs({**now, "algorithm imports wmod": c}, now) == ["algorithm imports wmod"]
    assert changed_inputs(now, {"algorithm": a, "dataset": a}) == ["algorithm imports wmod", "dataset data x.csv"]
    assert changed_inputs({}, {"devices": a}) == ["devices"]
