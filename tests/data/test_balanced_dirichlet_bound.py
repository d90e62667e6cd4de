"""`--partition balanced-dirichlet` ends (issue 49 item 5, hostile battery 5's problem 8): FIARSE's rule redraws a
sample's class while it is used up, without a bound, so at a small alpha it looped for ever. Where the source ends
the draws are the source's, to the bit (the generator left where the source leaves it); where it cannot, one
sentence naming alpha, the clients and the bound, exit 2, in `simulate` and `data inspect` alike."""


import numpy as np
import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.data import partition
from hasfl_ray.data.partition import MAX_REDRAWS, partition_labels
from hasfl_ray.errors import ConfigError

from data.test_partition_schemes import LABELS, source_balanced_dirichlet
from deadlines import deadline


@pytest.mark.parametrize("clients,alpha,seed", [(8, 0.3, 1), (10, 0.3, 4), (8, 0.2, 3), (7, 0.5, 0)])
def test_where_the_source_ends_the_draws_and_the_generator_are_its_own(clients, alpha, seed):
    """Cases where one sample's class takes the source 1,300 to 22,000 redraws (drawn in blocks here, past the
    first 64): the parts, and the draws after them, are the source's."""
    ours_rng, theirs_rng = np.random.default_rng(seed), np.random.default_rng(seed)
    with deadline(60):
        ours = partition_labels(LABELS, clients, "balanced-dirichlet", alpha, ours_rng)
    assert [p.tolist() for p in ours] == source_balanced_dirichlet(LABELS, clients, alpha, theirs_rng)
    assert ours_rng.random(3).tolist() == theirs_rng.random(3).tolist()
    assert ours_rng.integers(1000, size=3).tolist() == theirs_rng.integers(1000, size=3).tolist()


def test_proportions_with_no_chance_left_are_refused_at_once(monkeypatch):
    """A client whose proportions put nothing at all on the classes left: the source never ends; refused before
    a single redraw (the bound made tiny shows no redraw was needed to know)."""
    labels = np.repeat(np.arange(2), [5, 100])
    monkeypatch.setattr(partition, "MAX_REDRAWS", 10 ** 12)
    rng = np.random.default_rng(3)
    with deadline(30), pytest.raises(ConfigError) as caught:
        partition.balanced_dirichlet_partition(labels, 2, 1e-6, rng)
    message = str(caught.value)
    assert "alpha 1e-06 over 2 clients" in message and "none of their mass" in message, message
    assert "1,000,000,000,000 redraws a sample" in message, message


def one_sentence(result):
    message = result.output.strip()
    assert result.exit_code == 2, (result.exit_code, message, result.exception)
    assert message.startswith("Error: ") and len(message.splitlines()) == 1 and "Traceback" not in message, message
    return message


@pytest.mark.parametrize("alpha,clients", [("0.1", "20"), ("0.001", "10")])
def test_simulate_and_data_inspect_end_in_one_sentence_naming_the_bound(tmp_path, alpha, clients):
    runs = [["simulate", "--backend", "local", "--partition", "balanced-dirichlet", "--alpha", alpha, "--clients",
             clients, "--clients-per-round", "3", "--rounds", "1", "--quiet", "--out", str(tmp_path / "run")],
            ["data", "inspect", "--partition", "balanced-dirichlet", "--alpha", alpha, "--clients", clients]]
    for args in runs:
        with deadline(120):
            message = one_sentence(CliRunner().invoke(main, args))
        assert f"partition 'balanced-dirichlet' with alpha {alpha} over {clients} clients cannot be drawn" in message
        assert f"{MAX_REDRAWS:,} redraws a sample" in message and "--alpha" in message, message
    assert not (tmp_path / "run").exists()  # refused before anything is written
