"""`hasfl-ray cost` and `hasfl-ray bench aggregate`, the h66 battery (RELIABILITY rows late-d..): a comma list of
--layout values (refused with click's generic choice message, where --models takes a list), and cost's --dataset
and --data-dir given with a model that never reads them (dropped in silence)."""

import json

import pytest

from sentences import invoke, refused


# ----------------------------------------------------------------------- late-d: bench aggregate --layout LIST

def test_bench_aggregate_takes_a_list_of_layouts():
    """`--layout slice,index` runs each layout's case, in that order, as `--models a,b` runs each model."""
    result = invoke("bench", "aggregate", "--layout", "slice,index", "--models", "emnist", "--clients", "2",
                    "--repeats", "1", "--skip-slow", "--threads", "1", "--json")
    assert result.exit_code == 0, result.output
    cases = json.loads(result.output.splitlines()[-1])
    assert [(c["layout"], c["clients"]) for c in cases] == [("slice", 2), ("index", 2)]
    assert "case 2 of 2: EMNIST CNN, 2 clients, layout index" in result.output


@pytest.mark.parametrize("args, words", [
    (["--layout", "slice,bogus"], ["--layout", "'slice,bogus' names bogus, not a layout",
                                   "expected slice, window"]),
    # h71: a name given twice ran (and printed) its cases twice, exit 0
    (["--layout", "index,slice,index"], ["--layout", "'index,slice,index' names index more than once",
                                         "expected each layout once"]),
    (["--models", "emnist,emnist"], ["--models", "names emnist more than once", "expected each model once"]),
    (["--models", "digits"], ["--models", "'digits' names digits, not a model", "emnist,cifar10"]),
    (["--clients", "2,3,2"], ["--clients", "'2,3,2' names 2 more than once", "expected each client count once"]),
    (["--layout", ","], ["--layout", "names no layout", "a comma list of them"]),
    (["--layout", "slice,window", "--device", "cuda"], ["--layout window runs on the CPU only",
                                                        "expected --device cpu (or a --layout list without it)"]),
    (["--layout", "slice,depth", "--models", "emnist,shakespeare"], ["'shakespeare' has none"]),
    (["--clients", "0"], ["--clients", "'0'", "positive client counts"]),
    (["--repeats", "0"], ["--repeats", "0 is not in the range 1<=x<=100"]),
    (["--dtype", "bf16"], ["No such option '--dtype'"]),
])
def test_bench_aggregate_bad_values_are_one_sentence(args, words):
    refused(invoke("bench", "aggregate", "--clients", "2", "--repeats", "1", *args), *words)


# ------------------------------------------------------------------- late-e: cost flags a model never reads

@pytest.mark.parametrize("args, words", [
    (["--model", "cifar10", "--dataset", "emnist"],
     ["--dataset is 'emnist' but --model 'cifar10' is a dataset's own model", "expected --dataset only with a ResNet"]),
    (["--model", "shakespeare", "--dataset", "cifar100"], ["--dataset is 'cifar100'"]),
    (["--model", "cifar10", "--data-dir", "data"], ["--data-dir is 'data'", "expected --data-dir only with a plug-in"]),
    (["--model", "preresnet18", "--data-dir", "data"], ["--data-dir is 'data'", "--model 'preresnet18'"]),
])
def test_cost_refuses_what_it_would_drop(args, words):
    """These printed the dataset's own table as if the flag had been read."""
    refused(invoke("cost", *args), *words)


@pytest.mark.parametrize("args", [
    ["--model", "cifar10", "--dataset", "cifar10"],  # its own dataset: what it is costed on anyway
    ["--model", "preresnet18", "--dataset", "emnist"],
    ["--model", "cifar10", "--algorithm", "depthfl", "--depths", "1,1,2,3"],  # one depth per size: repeats are sizes'
])
def test_cost_still_takes_what_it_reads(args):
    result = invoke("cost", *args)
    assert result.exit_code == 0, result.output


def test_cost_of_a_plugin_model_without_its_data_names_a_command_it_has(tmp_path, monkeypatch):
    """The loaders' sentence ended "or --download", a flag `cost` does not take (`No such option` when tried)."""
    import os

    monkeypatch.chdir(tmp_path)
    vit = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "tiny_vit.py") + ":TinyViT"
    result = invoke("cost", "--model", vit, "--dataset", "cifar10", "--data-dir", "none")
    message = result.output.strip()
    assert result.exit_code == 2 and len(message.splitlines()) == 1 and "Traceback" not in message, message
    assert "CIFAR-10 batches not found" in message and "or --download" not in message, message
    assert message.endswith("or `hasfl-ray data inspect --dataset cifar10 --data-dir none --download` first"), message
