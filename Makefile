# make demo: create .venv, install, run the default simulation.  make test: create .venv, install, run the tests.
# make docs: create .venv, install, build the documentation site (docs/, mkdocs.yml) into build/site.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
export CUDA_HOME ?= /usr/local/cuda
export TORCH_CUDA_ARCH_LIST ?= 9.0
# make test's pytest-xdist workers: one pytest kept about half a core busy (it waits on Ray, subprocesses and CLI
# start-ups), so two workers on two cores ran the suite in 18-22 % less wall time (benchmarks/RESULTS.md);
# --dist loadfile keeps each test file whole on one worker (its module fixtures and its shared Ray start once).
TEST_WORKERS ?= 2

.PHONY: venv install demo test docs bench soak gpu-check clean

$(VENV)/.deps: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -r requirements.txt -r requirements-dev.txt
	touch $@

$(VENV)/.built: $(VENV)/.deps setup.py $(wildcard csrc/*.cpp csrc/*/*.cpp csrc/*/*.cu csrc/*.h csrc/*/*.h)
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

install: $(VENV)/.built

demo: install
	$(VENV)/bin/hasfl-ray simulate --out runs/demo --force

test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

docs: install  # --strict: a broken link or anchor fails the build (the CLI reference is generated from the commands)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -d build/site

bench: install
	$(PY) benchmarks/bench_aggregate.py

SOAK_DATA ?= data
soak: install  # 500 HAS-FL rounds on Ray with 2 actors, then 500 on the local backend on the EMNIST files in
	# $(SOAK_DATA) (continuous widths): memory flat within 2 %, no process left (not in CI: ~30+ min)
	$(PY) benchmarks/soak.py --rounds 500
	$(PY) benchmarks/soak.py --rounds 500 --backend local --dataset emnist --data-dir $(SOAK_DATA) --local-steps 2 \
		--eval-every 25 --eval-samples 300

gpu-check:  # on a GPU machine whose python3 already has torch (no venv, no Ray needed)
	benchmarks/gpu_check.sh

clean:
	rm -rf $(VENV) build *.egg-info hasfl_ray/*.so
