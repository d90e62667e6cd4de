"""benchmarks/gpu_check.sh's commands, as docs/gpu.md describes them, without running them: a stand-in Python records
every command the script gives it (and runs only its small `-c` and `-` snippets), so the plan of each mode is read
in seconds. `DEVICE=cpu QUICK=1` is the CPU rehearsal docs/gpu.md names: every Shakespeare round reads the generated
tiny play there (the sample's round ran past its 150 s on the 2-core CPU, so the rehearsal exited 1), and the GPU
run reads the sample."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def plan(tmp_path, **env):
    """The command lines gpu_check.sh hands its Python, in order (snippets run by the real interpreter)."""
    log, stub = tmp_path / "calls.txt", tmp_path / "python"
    stub.write_text(f'#!/bin/bash\ncase "$1" in -c|-) exec {sys.executable} "$@";; esac\n'
                    f'printf "%s\\n" "$*" >> {log}\n')
    stub.chmod(0o755)
    out = tmp_path / "out"
    environment = {**os.environ, "PYTHON": str(stub), **env}
    result = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_check.sh"), str(tmp_path / "data"), str(out)],
                            env=environment, capture_output=True, text=True, timeout=300)
    assert (out / "summary.md").exists(), result.stderr[-2000:]
    return log.read_text().splitlines(), out


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="gpu_check.sh needs bash and coreutils' timeout")
def test_the_cpu_rehearsal_never_reads_the_shakespeare_sample(tmp_path):
    calls, out = plan(tmp_path, DEVICE="cpu", QUICK="1")
    shakespeare = [call for call in calls if "--dataset shakespeare" in call]
    assert len(shakespeare) == 2 and all(f"--data-dir {out}/tiny-play" in call for call in shakespeare), shakespeare
    assert not any(f"{tmp_path}/data/shakespeare" in call for call in calls)
    assert (out / "tiny-play" / "input.txt").stat().st_size > 1000  # the play its rounds read


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="gpu_check.sh needs bash and coreutils' timeout")
def test_the_gpu_run_reads_the_shakespeare_sample(tmp_path):
    calls, out = plan(tmp_path, DEVICE="cuda", QUICK="0")
    shakespeare = [call for call in calls if "--dataset shakespeare" in call]
    assert len(shakespeare) == 1 and f"--data-dir {tmp_path}/data/shakespeare" in shakespeare[0], shakespeare
    assert "--clients" not in shakespeare[0] and not (out / "tiny-play").exists()
