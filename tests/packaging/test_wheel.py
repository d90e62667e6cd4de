"""A plain install: the built wheel, installed into a fresh virtual environment, declares Ray and runs the default
`hasfl-ray simulate` (the Ray backend)."""

import json
import os
import subprocess
import sys
import sysconfig
import venv
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
    return result


def shared_dependencies(target):
    """A folder of links to this environment's installed packages, minus hasfl-ray itself, so the fresh
    environment takes torch and Ray from here instead of downloading them (and pip cannot touch this install)."""
    site = sysconfig.get_paths()["purelib"]
    os.makedirs(target)
    for name in os.listdir(site):
        lowered = name.lower()
        if lowered.startswith(("hasfl_ray", "hasfl-ray", "__editable__", "_hasfl")) or lowered.endswith(".pth"):
            continue
        os.symlink(os.path.join(site, name), os.path.join(target, name))
    return target


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="needs to run from a virtual environment (make test)")
def test_the_wheel_installs_into_a_fresh_environment_and_runs_the_default_command(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HASFL_", "PYTHONPATH", "VIRTUAL_ENV"))}
    # The extension build is CI's editable install's job; the wheel here is pure Python (pure-torch fallback).
    env["HASFL_NO_EXTENSION"] = "1"
    wheels = tmp_path / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), REPO],
        env=env)
    (wheel,) = wheels.glob("hasfl_ray-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(next(n for n in archive.namelist() if n.endswith("METADATA"))).decode()
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert any(r.startswith("ray") and "extra ==" not in r for r in requires), requires

    fresh = tmp_path / "fresh"
    venv.create(fresh, with_pip=True)
    python = fresh / "bin" / "python"
    fresh_site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    # the fresh environment's own (older) setuptools would shadow the one torch's metadata asks for
    run([str(python), "-m", "pip", "uninstall", "-y", "-q", "setuptools"], env=env)
    links = shared_dependencies(str(tmp_path / "deps"))
    with open(os.path.join(fresh_site, "shared_deps.pth"), "w", encoding="utf-8") as handle:
        handle.write(links + "\n")
    run([str(python), "-m", "pip", "install", "-q", "--no-index", str(wheel)], env=env)  # deps resolved locally

    out = tmp_path / "run"
    result = run([str(fresh / "bin" / "hasfl-ray"), "simulate", "--rounds", "2", "--clients", "6",
                  "--clients-per-round", "3", "--quiet", "--out", str(out)], env=env, cwd=str(tmp_path))
    config = (out / "config.yaml").read_text()
    assert "backend: ray" in config, config  # the default backend, with Ray from the declared dependency
    assert json.loads((out / "summary.json").read_text())["rounds"] == 2
    where = run([str(python), "-c", "import hasfl_ray; print(hasfl_ray.__file__)"], env=env, cwd=str(tmp_path)).stdout
    assert where.startswith(fresh_site), where  # the installed wheel ran, not the repository checkout
    assert "Traceback" not in result.stderr
