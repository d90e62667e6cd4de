"""A device trace is read with a memory estimate and refused beyond it (issue 37 item 7): reading takes at most
TRACE_MEMORY_FACTOR bytes a byte of the file (read whole into Python lists it took 28-39 times the file, measured
on these formats), a trace whose estimate exceeds the machine's memory is one sentence before a byte is parsed,
and so is a pool whose intervals, dealt to every client, would not fit; the streamed reader gives what the whole
reader gave (tests/clock/test_clock_model.py)."""

import os
import tracemalloc

import numpy as np
import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.clock import read_trace
from hasfl_ray.clock import trace as trace_module
from hasfl_ray.clock.trace import TRACE_MEMORY_FACTOR
from hasfl_ray.errors import DataError

ROWS = 40_000
NUMBERS = "speed_macs_per_s,down_bytes_per_s,up_bytes_per_s,latency_s"
# the shortest rows of each kind of trace: the most memory a byte of the file
FORMATS = {
    "client ids": ("client," + NUMBERS, lambda i: f"{i},1,1,1,0", False),
    "names": ("name," + NUMBERS, lambda i: f"{i},1,1,1,0", True),
    "a pool": (NUMBERS, lambda i: "1,1,1,0", False),
    "a pool with intervals": (NUMBERS + ",availability", lambda i: "1,1,1,0,0-1 2-3 4-5", False),
    "client ids with intervals": ("client," + NUMBERS + ",availability", lambda i: f"{i},1,1,1,0,0-1", False),
}


@pytest.mark.parametrize("kind", list(FORMATS))
def test_reading_a_trace_takes_at_most_the_factor_times_its_size(tmp_path, kind):
    header, row, named = FORMATS[kind]
    path = tmp_path / "t.csv"
    path.write_text(header + "\n" + "".join(row(i) + "\n" for i in range(ROWS)))
    names = [str(i) for i in range(ROWS)] if named else None
    tracemalloc.start()
    try:
        profiles = read_trace(str(path), ROWS, names)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(profiles) == ROWS and peak <= TRACE_MEMORY_FACTOR * os.path.getsize(path), peak / path.stat().st_size


def test_a_trace_beyond_the_estimate_is_one_sentence_before_it_is_parsed(tmp_path, monkeypatch):
    path = tmp_path / "big.csv"
    path.write_text("client," + NUMBERS + "\n" + "".join(f"{i},1e9,1e6,1e5,0.1\n" for i in range(1000)))
    size = path.stat().st_size
    with pytest.raises(DataError, match=rf"is {size / 1e3:.3g} kB, which needs about .* of memory to read "
                                        rf"\({TRACE_MEMORY_FACTOR} bytes a byte\) but this machine has 100 kB"):
        read_trace(str(path), 1000, total=100_000)
    monkeypatch.setattr(trace_module, "physical_memory", lambda: 50_000)  # the CLI: exit 2, one line, no folder
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--rounds", "1", "--quiet", "--devices",
                                       "big.csv", "--out", "run"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "device trace 'big.csv' is" in result.output and len(result.output) < 240
    assert not (tmp_path / "run").exists()


def test_a_pool_whose_dealt_intervals_cannot_fit_is_one_sentence(tmp_path):
    path = tmp_path / "pool.csv"
    path.write_text(NUMBERS + ",availability\n1e9,1e6,1e5,0.1," + " ".join(f"{2 * k}-{2 * k + 1}" for k in range(100))
                    + "\n")
    with pytest.raises(DataError, match="deals 1,000,000 availability intervals to the run's 10,000 clients, about "
                                        "16 MB of memory, but this machine has 1 MB"):
        read_trace(str(path), 10_000, total=1_000_000)
    profiles = read_trace(str(path), 100)  # dealt in turn: every client the pool's row
    offsets, starts, ends, period = profiles.intervals
    assert np.array_equal(offsets, np.arange(101) * 100) and period == 199.0
    assert np.array_equal(starts[100:200], np.arange(100) * 2.0)


@pytest.mark.parametrize("cell", ["²", "1.5", "x", "9" * 30])
def test_a_client_id_that_is_not_an_integer_is_one_sentence(tmp_path, cell):
    path = tmp_path / "t.csv"
    path.write_text("client," + NUMBERS + f"\n0,1e9,1e6,1e5,0\n{cell},1e9,1e6,1e5,0\n")
    with pytest.raises(DataError, match=rf"has client '{cell}' on line 3; expected an integer client id"):
        read_trace(str(path), 2)


def test_a_trace_that_is_not_utf8_or_not_csv_is_one_sentence(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"client," + NUMBERS.encode() + b"\n0,1e9,1e6,1e5,\xff\n")
    with pytest.raises(DataError, match="is not UTF-8 text"):
        read_trace(str(path), 1)
    path.write_bytes(b"client," + NUMBERS.encode() + b"\n0,1e9,1e6,1e5," + b"9" * 200_000 + b"\n")
    with pytest.raises(DataError, match="has a field longer than 131,072 characters on line 2; expected fields"):
        read_trace(str(path), 1)  # issue 49 (battery 5, A230): was "not a CSV file"
