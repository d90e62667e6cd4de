"""Reading a sweep's files in the sweep tests: each cell's status in sweep.json and a cell's params_sha256."""

import json
import os


def cells(out):
    """{cell name: status} of OUT/sweep.json."""
    with open(os.path.join(out, "sweep.json"), encoding="utf-8") as handle:
        return {c["name"]: c["status"] for c in json.load(handle)["cells"]}


def sha(run_dir):
    """params_sha256 of RUN_DIR/summary.json."""
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as handle:
        return json.load(handle)["params_sha256"]
