"""`data inspect --plot FILE` (issue 45 item 5): the clients × labels heat map of the partition `data inspect`
prints, drawn into FILE in the format its extension names; a name it cannot write is one sentence, exit 2, before
the data is read."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from hasfl_ray.analysis import partition_plot
from hasfl_ray.cli.main import main

ARGS = ["data", "inspect", "--clients", "7", "--seed", "3"]


def test_the_heat_map_holds_each_clients_label_counts(tmp_path, monkeypatch):
    drawn = {}
    save = partition_plot._save

    def recording(fig, out_dir, name, fmt):
        drawn["values"] = np.asarray(fig.axes[0].images[0].get_array())
        drawn["labels"] = (fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel())
        return save(fig, out_dir, name, fmt)

    monkeypatch.setattr(partition_plot, "_save", recording)
    result = CliRunner().invoke(main, [*ARGS, "--json", "--plot", str(tmp_path / "partition.png")])
    assert result.exit_code == 0, result.output
    histograms = [row["label_histogram"] for row in json.loads(result.output)["clients"]]
    assert drawn["values"].tolist() == histograms and drawn["values"].shape == (7, 10)
    assert drawn["labels"] == ("label", "client")
    assert (tmp_path / "partition.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("name, head", [("p.pdf", b"%PDF"), ("p.svg", b"<?xml")])
def test_the_extension_names_the_format(tmp_path, name, head):
    result = CliRunner().invoke(main, [*ARGS, "--plot", str(tmp_path / name)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / name).read_bytes().startswith(head)
    assert "label_histogram" in result.output  # the table is printed as before


@pytest.mark.parametrize("name, words", [("p.jpg", "expected a file name ending in .png, .pdf, .svg"),
                                         ("missing/p.png", "does not exist; expected a file in an existing folder")])
def test_a_file_it_cannot_write_is_one_sentence(tmp_path, name, words):
    result = CliRunner().invoke(main, [*ARGS, "--plot", str(tmp_path / name)])
    assert result.exit_code == 2 and words in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []
