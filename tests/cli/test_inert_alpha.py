"""An ``alpha`` given where no partition reads it (``--partition iid``, ``classes:K``, ``flwr:...``; synthetic and
shakespeare, which have their own clients) was accepted and did nothing. ``check_inert_keys`` refuses it in one
sentence (exit 2) naming alpha, its value and the partitions that read it, for the keys the user gave a run: flags,
a config file's, the API's keywords, a sweep cell's ``per_dataset`` keys. A key given for runs of several datasets
at once (a sweep config's shared keys, a variant's, the sweep's flags) is not refused where one dataset ignores it:
a sweep over digits and synthetic with one ``alpha`` keeps working, and so does ``simulate --config`` of one cell."""

import pytest

from hasfl_ray.api import make_config
from hasfl_ray.cli.simulate import build_config
from hasfl_ray.errors import ConfigError
from hasfl_ray.sweep.plan import plan_sweep
from sentences import invoke, refused

TINY = ["--backend", "local", "--rounds", 1, "--clients", 6, "--clients-per-round", 3, "--quiet"]
READERS = "partition dirichlet or balanced-dirichlet"


@pytest.mark.parametrize("args, why", [
    (["--partition", "iid"], "partition 'iid' does not read it"),
    (["--partition", "classes:2"], "partition 'classes:2' does not read it"),
    (["--partition", "flwr:iid"], "partition 'flwr:iid' does not read it"),
    (["--dataset", "synthetic"], "dataset 'synthetic' has its own clients"),
    (["--dataset", "shakespeare"], "dataset 'shakespeare' has its own clients"),
])
def test_an_alpha_no_partition_reads_is_refused(tmp_path, args, why):
    out = tmp_path / "run"
    refused(invoke("simulate", *TINY, "--alpha", 0.1, *args, "--out", out), "alpha is 0.1 but", why, READERS)
    assert not out.exists()


def test_the_api_and_a_config_file_are_refused_alike(tmp_path):
    with pytest.raises(ConfigError, match=r"^alpha is 0\.2 but partition 'iid' does not read it"):
        make_config(alpha=0.2, partition="iid")
    (tmp_path / "run.yaml").write_text("alpha: 0.2\npartition: shards:2\n")
    with pytest.raises(ConfigError, match=r"alpha is 0\.2 but partition 'shards:2' does not read it \(config file"):
        build_config(str(tmp_path / "run.yaml"), {})


def test_an_alpha_a_partition_reads_is_kept(tmp_path):
    assert make_config(alpha=0.2).alpha == 0.2  # dirichlet, the default
    assert make_config(alpha=0.2, partition="balanced-dirichlet").alpha == 0.2
    assert make_config(partition="iid").partition == "iid"  # no alpha given: nothing to refuse
    assert make_config(dataset="synthetic").dataset == "synthetic"
    out = tmp_path / "run"
    result = invoke("simulate", *TINY, "--alpha", 0.5, "--out", out)
    assert result.exit_code == 0, result.output
    assert "alpha: 0.5" in (out / "config.yaml").read_text()


SWEEP = """\
clients: 6
clients_per_round: 3
rounds: 1
alpha: 0.1
sweep:
  datasets: [digits, synthetic]
  algorithms: [hasfl]
{per_dataset}"""


def test_a_sweeps_shared_alpha_over_datasets_keeps_working(tmp_path):
    """Shared alpha: the digits cell reads it, the synthetic cell ignores it, neither is refused; a variant's keys
    and the sweep's own flags are shared the same way; ``simulate --config`` of the synthetic cell too."""
    config = tmp_path / "s.yaml"
    config.write_text(SWEEP.format(per_dataset=""))
    cells = {cell.dataset: cell for cell in plan_sweep(str(config), {}).cells}
    assert cells["digits"].values["alpha"] == 0.1 and cells["synthetic"].values["alpha"] == 0.1
    assert {c.dataset for c in plan_sweep(str(config), {"alpha": 0.4}).cells} == {"digits", "synthetic"}
    assert build_config(str(config), {"dataset": "synthetic"}).dataset == "synthetic"
    with pytest.raises(ConfigError, match="alpha is 0.4 but dataset 'synthetic' has its own clients"):
        build_config(str(config), {"dataset": "synthetic", "alpha": 0.4})  # a flag is this run's own


def test_an_alpha_given_for_a_cell_whose_dataset_ignores_it_is_refused(tmp_path):
    config = tmp_path / "s.yaml"
    config.write_text(SWEEP.format(per_dataset="  per_dataset:\n    synthetic: {alpha: 0.2}\n"))
    with pytest.raises(ConfigError, match=r"alpha is 0\.2 but dataset 'synthetic' has its own clients \(sweep "
                                          r"cell synthetic-hasfl-seed42\)"):
        plan_sweep(str(config), {})
    result = invoke("sweep", config, "--out", tmp_path / "runs", "--backend", "local")
    refused(result, "alpha is 0.2 but dataset 'synthetic'", READERS)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args", [["--partition", "iid"], ["--algorithm", "depthfl"]])
def test_a_run_rerun_from_its_own_config_gives_no_key_of_its_own(tmp_path, args):
    # A run's config holds every key (alpha 0.3 beside partition iid; aggregation_weights samples beside depthfl's
    # count mean): rerun from `load_run(path).config` (or migrate_config of its config.yaml), it must not read as the
    # user's keys and be refused; it reruns to the same bits
    import hasfl_ray

    first = tmp_path / "first"
    assert invoke("simulate", *TINY, *args, "--out", first).exit_code == 0
    config = hasfl_ray.load_run(str(first)).config
    again = hasfl_ray.simulate(config, out_dir=str(tmp_path / "again"), backend="local")
    assert again.summary["params_sha256"] == hasfl_ray.load_run(str(first)).summary["params_sha256"]


@pytest.mark.parametrize("args, why", [
    (["--alpha", 0.1, "--partition", "iid"], "alpha is 0.1 but partition 'iid' does not read it"),
    (["--alpha", 0.3, "--partition", "shards:2"], "alpha is 0.3 but partition 'shards:2' does not read it"),
    (["--alpha", 0.2, "--dataset", "synthetic"], "alpha is 0.2 but dataset 'synthetic' has its own clients"),
])
def test_data_inspect_refuses_an_alpha_no_partition_reads_as_simulate_does(args, why):
    """``data inspect`` showed an iid partition for ``--alpha 0.1 --partition iid`` (the alpha read by nothing);
    simulate's check now refuses it there too, the default alpha (0.3) never, an alpha given as 0.3 too."""
    refused(invoke("data", "inspect", "--clients", 4, *args), why)
    shown = invoke("data", "inspect", "--clients", 4, "--partition", "iid")
    assert shown.exit_code == 0 and "partition iid" in shown.output, shown.output
