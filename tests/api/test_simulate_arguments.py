"""`hasfl_ray.simulate`'s own arguments given as a hostile user would (docs/usage.md#python, docs/plugins.md): a config
or algorithm_options that is no mapping, a dataclass class for options, the base class as the algorithm. Each is one
ConfigError sentence naming the argument, the value and what was expected, before any folder is made (h62)."""

import dataclasses

import pytest

import hasfl_ray
from hasfl_ray.errors import ConfigError

TINY = dict(dataset="digits", rounds=1, clients=6, clients_per_round=3, backend="local", progress=False)


@dataclasses.dataclass
class Options:
    gain: float = 0.5


@pytest.mark.parametrize("arguments,sentence", [
    (dict(config=[1, 2]), r"^config is \[1, 2\]; expected a RunConfig, a mapping of config keys or a YAML path$"),
    (dict(config=5), r"^config is 5; expected a RunConfig, a mapping of config keys or a YAML path$"),
    (dict(algorithm_options=[1, 2]), r"^algorithm_options is \[1, 2\]; expected a mapping of option names to values "
                                     r"\(or an instance of the options dataclass\)$"),
    (dict(algorithm_options="gain=1"), r"^algorithm_options is 'gain=1'; expected a mapping of option names"),
    (dict(algorithm_options=Options), r"^algorithm_options is the class .*Options.*; expected a mapping of option "
                                      r"names to values \(or an instance of the options dataclass\)$"),
    (dict(algorithm=hasfl_ray.Algorithm), r"^algorithm is 'hasfl_ray.algorithms.base:Algorithm', the base class "
                                          r"hasfl_ray.Algorithm itself; expected a class that subclasses it$"),
])
def test_a_bad_argument_is_one_sentence_and_makes_no_folder(tmp_path, arguments, sentence):
    """Before: `dict()`'s "cannot convert dictionary update sequence element #0 to a sequence" (a list),
    "dictionary update sequence element #0 has length 1; 2 is required" (a string), "'int' object is not iterable",
    `asdict()`'s "should be called on dataclass instances" (the options class), and "Algorithm is not a subclass of
    hasfl_ray.Algorithm" for the base class itself."""
    arguments = {"algorithm": "examples/loss_policy.py:LossPolicy", **arguments}
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=sentence):
        hasfl_ray.simulate(**TINY, out_dir=str(out), **arguments)
    assert not out.exists()



def test_a_config_file_given_as_a_path_is_read(tmp_path):
    """A `pathlib.Path` to a YAML config is read as its string is (`config` no mapping is otherwise refused)."""
    from hasfl_ray.api import make_config

    (tmp_path / "run.yaml").write_text("rounds: 3\nclients: 6\nclients_per_round: 3\n")
    by_path = make_config(tmp_path / "run.yaml")
    assert by_path.rounds == 3 and by_path == make_config(str(tmp_path / "run.yaml"))
