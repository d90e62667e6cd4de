"""The example notebook (examples/notebook.ipynb, docs/notebook.md) runs as written, top to bottom, in a fresh
Jupyter kernel (nbclient): every cell without an error, and the outputs the page promises."""

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_example_notebook_runs_top_to_bottom(tmp_path):
    nbformat = pytest.importorskip("nbformat", reason="needs nbformat and nbclient (requirements-dev.txt)")
    nbclient = pytest.importorskip("nbclient", reason="needs nbformat and nbclient (requirements-dev.txt)")
    pytest.importorskip("ipykernel", reason="needs ipykernel, the notebook's kernel (requirements-dev.txt)")
    notebook = nbformat.read(os.path.join(ROOT, "examples", "notebook.ipynb"), as_version=4)
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "\n".join(output.get("text", "") + str(output.get("data", {}).get("text/plain", ""))
                     for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", []))
    assert not [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])
                if output.get("output_type") == "error"]
    assert "final accuracy" in text and "after 4 rounds" in text
    assert "parameters at width 0.5" in text and "'client': 0" in text
    assert "round 0: accuracy" in text
