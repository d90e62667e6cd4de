"""Trace availability with fractional bounds (issue 49 item 5, hostile battery 5's problem 6): the time ``next_on``
gives is on by ``window``'s reckoning and later than the time asked, and a window's end is after the time it is
asked at, so the synchronous clock's wait and the asynchronous loop move on (both used to compute ``time - cycle *
period`` and compare it with the bounds: 1.9 - 1.0 is 0.8999999999999999 < 0.9, and the clock waited for ever)."""


import numpy as np
import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.clock import TraceAvailability
from hasfl_ray.clock.availability import wait_until
from deadlines import deadline

HEAD = "client,speed_macs_per_s,down_bytes_per_s,up_bytes_per_s,latency_s,availability\n"
#: The battery's availabilities: the synchronous hang, then the three asynchronous ones.
BOUNDS = ["0-0.5 0.9-1", "0.1-0.3 0.7-1", "0-0.1 0.3-0.7", "0-0.0004 0.0006-0.001"]


def availability(text):
    pairs = [tuple(float(x) for x in span.split("-")) for span in text.split()]
    starts, ends = np.array([a for a, _ in pairs]), np.array([b for _, b in pairs])
    return TraceAvailability(np.array([0, len(pairs)]), starts, ends, float(ends.max()))


@pytest.mark.parametrize("text", BOUNDS + ["0-50 60-100", "0.05-0.15 0.25-0.35 0.45-0.85"])
def test_next_on_is_on_and_later_and_an_on_window_ends_later(text):
    avail = availability(text)
    times = np.concatenate([np.linspace(0, 7 * avail.period, 4001), [1.5, 2.3, 1.9, 0.8999999999999999]])
    for time in times.tolist():
        on, until = avail.window(0, time)
        if on:
            assert until > time, (text, time, until)  # never "available until now"
            assert avail.next_on(0, time) == time
        else:
            wake = avail.next_on(0, time)
            assert wake > time and avail.window(0, wake)[0], (text, time, wake)


def test_the_battery_case_by_hand():
    avail = availability("0-0.5 0.9-1")
    assert avail.window(0, 1.5)[0] is False and avail.next_on(0, 1.5) == 1.0 + 0.9
    assert avail.window(0, 1.0 + 0.9) == (True, 2.0 + 0.5)  # on across the wrap into the next cycle's first interval
    avail = availability("0.1-0.3 0.7-1")
    assert avail.window(0, 2.3) == (False, 2.3) and avail.next_on(0, 2.3) == 2.0 + 0.7


def test_integer_bounds_answer_as_before():
    """Bounds whose sums are exact give the answers they gave (a trace that worked keeps its runs' bits)."""
    avail = availability("0-50 60-100")
    assert avail.window(0, 10.0) == (True, 50.0) and avail.window(0, 50.0) == (False, 50.0)
    assert avail.next_on(0, 50.0) == 60.0 and avail.window(0, 160.0) == (True, 250.0)
    assert avail.next_on(0, 255.0) == 260.0


@pytest.mark.parametrize("now,time", [(1.5, 1.9), (0.0, 0.9), (1e-300, 1.0), (3.0, 3.0000000000000004), (0.1, 7.3)])
def test_the_clocks_wait_lands_on_the_time_it_waits_for(now, time):
    wait = wait_until(now, time)
    assert now + wait >= time and wait <= time - now + 4 * np.spacing(time)


def trace(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_text(HEAD + "".join(f"{i},1e9,1e6,1e6,0.01,{text}\n" for i in range(6)))
    return str(path)


TINY = ["simulate", "--backend", "local", "--clients", "6", "--clients-per-round", "3", "--quiet"]


def test_a_synchronous_run_with_fractional_bounds_ends(tmp_path):
    with deadline(120):
        result = CliRunner().invoke(main, TINY + ["--devices", trace(tmp_path, "0-0.5 0.9-1"), "--deadline", "5",
                                                  "--rounds", "6", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, (result.output, result.exception)
    assert (tmp_path / "run" / "summary.json").exists()


@pytest.mark.parametrize("text", ["0.1-0.3 0.7-1", "0-0.1 0.3-0.7"])
def test_an_asynchronous_run_with_fractional_bounds_ends(tmp_path, text):
    with deadline(120):
        result = CliRunner().invoke(main, TINY + ["--mode", "async", "--devices", trace(tmp_path, text),
                                                  "--rounds", "6", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, (result.output, result.exception)
    assert (tmp_path / "run" / "summary.json").exists()


def test_longest_on_joins_the_wrap_and_an_always_on_client_is_infinite():
    avail = TraceAvailability(np.array([0, 2, 2, 3, 4]), np.array([0.0, 0.6, 0.0, 0.2]),
                              np.array([0.4, 1.0, 1.0, 0.3]), 1.0)
    assert np.allclose(avail.longest_on(), [0.8, np.inf, np.inf, 0.1])  # no intervals, or 0 to the period: always


def test_an_asynchronous_run_no_update_can_reach_is_refused_in_one_sentence(tmp_path):
    """``0-0.0004 0.0006-0.001`` with a latency of 0.01 s: on for 0.8 ms at most, every dispatch is lost; the loop
    would dispatch for ever (simulated time moving, no server update). Refused before anything is written."""
    with deadline(60):
        result = CliRunner().invoke(main, TINY + ["--mode", "async", "--devices", trace(tmp_path, BOUNDS[3]),
                                                  "--rounds", "6", "--out", str(tmp_path / "run")])
    message = result.output.strip()
    assert result.exit_code == 2 and len(message.splitlines()) == 1, (message, result.exception)
    assert "gives no client a stretch of availability longer than its latency (client 0: on for at most 0.0008 s, " \
           "latency 0.01 s)" in message and "mode sync" in message, message
    assert not (tmp_path / "run").exists()
