# torch-vnpu: every target creates/reuses the virtual environment .venv and
# installs what it needs (Debian packages, torch==2.13.0, the build tools and
# this package) before running.
#   make demo   - train the GPT example on vnpu and cpu, plot both loss curves
#   make test   - runtime unit tests (ctest) + the Python test suite (pytest) + the documentation build
#   make docs   - the documentation site into out/docs (Sphinx; warnings are errors)
VENV    ?= .venv
PYTHON  ?= $(shell command -v python3.11 || command -v python3)
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
OUT     ?= out

.PHONY: demo test test-slow test-runtime test-python install deps system-deps bench bench-dist bench-page opinfo opinfo-slice hf-coverage check-wheel docs patches-page clean

$(PY):
	$(PYTHON) -m venv $(VENV)

system-deps:
	@if ! dpkg -s libgtest-dev >/dev/null 2>&1 || ! command -v ccache >/dev/null 2>&1; then \
	  echo "installing libgtest-dev ccache with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev ccache >/dev/null; \
	fi

$(VENV)/.deps: requirements-dev.txt | $(PY)
	$(PIP) install -q -r requirements-dev.txt
	touch $@

deps: system-deps $(VENV)/.deps

install: deps
	$(PIP) install -q --no-build-isolation --no-deps .

demo: install
	$(PY) examples/train_gpt.py --compare --out $(OUT)

test-runtime: deps
	$(VENV)/bin/cmake -S . -B build/runtime-tests -G Ninja -DVNPU_BUILD_PYTHON=OFF \
	  -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja >/dev/null
	$(VENV)/bin/cmake --build build/runtime-tests
	$(VENV)/bin/ctest --test-dir build/runtime-tests --output-on-failure

test-python: install
	cd tests && ../$(VENV)/bin/pytest -q -p no:cacheprovider --import-mode=importlib --durations=25 -m "not slow" .

# The long end-to-end cases marked `slow` (17: the GPT and gpt2 compiled, the sanitizer through a C++-wrapper graph, four C++-wrapper compiles (two lengths, second device, conv + batch norm, asynchronous call), two HF Trainer script runs, the FSDP/TP and extra HF and
# Lightning multi-process launches, Lightning under port.run), ~8 min quiet, ~15 min under load; not part of `make test`.
test-slow: install
	cd tests && ../$(VENV)/bin/pytest -q -p no:cacheprovider --import-mode=importlib -m slow .

test: test-runtime test-python docs

# The documentation site (docs/conf.py: Sphinx + MyST) into out/docs; any warning fails the build.
docs: install
	rm -rf $(OUT)/docs
	$(VENV)/bin/sphinx-build -W --keep-going -q -b html docs $(OUT)/docs
	@echo "docs: $(OUT)/docs/index.html"

# docs/device_neutrality.md from the patch registry (src/torch_vnpu/patches/registry.py); tests/test_patches.py checks it.
patches-page: install
	$(PY) -m torch_vnpu.patches --markdown > docs/device_neutrality.md

bench: install
	$(PY) benchmarks/eager_overhead.py --out $(OUT)/bench
	$(PY) benchmarks/train_step.py --out $(OUT)/bench
	$(PY) benchmarks/compile.py --out $(OUT)/bench
	$(PY) benchmarks/hf_step.py --out $(OUT)/bench
	$(PY) benchmarks/graph_replay.py --out $(OUT)/bench
	$(PY) benchmarks/decode.py --out $(OUT)/bench
	$(PY) benchmarks/port_overhead.py --out $(OUT)/bench
	$(PY) benchmarks/checkpoint_io.py --out $(OUT)/bench
	$(PY) benchmarks/async_save.py --out $(OUT)/bench
	$(PY) scripts/bench_page.py --in $(OUT)/bench --out docs/benchmarks.md

# Distributed (issue #10): collectives' bus bandwidth (vccl vs gloo, 2 and 4 ranks, ~5 min) and the
# DDP/FSDP step time of examples/train_gpt_dist.py (vnpu+vccl vs cpu+gloo, ~5 min).
bench-dist: install
	$(PY) benchmarks/collectives.py --out $(OUT)/bench
	$(PY) benchmarks/dist_train_step.py --out $(OUT)/bench
	$(PY) scripts/bench_page.py --in $(OUT)/bench --out docs/benchmarks.md

# docs/benchmarks.md again from the JSON already in $(OUT)/bench (e.g. after running one benchmark by hand);
# standard library only, so no install.
bench-page: | $(PY)
	$(PY) scripts/bench_page.py --in $(OUT)/bench --out docs/benchmarks.md

# Operator coverage (issue #3): the CI slice alone (also part of `make test`), and the full OpInfo sweep
# (every sample and reference input as given, and the first 3 of each in the 5 layout variants; ~2 h on
# 2 cores) with its report.
opinfo-slice: install
	cd tests && ../$(VENV)/bin/pytest -q -p no:cacheprovider --import-mode=importlib test_opinfo_slice.py

opinfo: install
	mkdir -p $(OUT) && cd $(OUT) && ../$(PY) ../scripts/opinfo_parity.py --jobs 2 --layout-limit 3 \
	  --json opinfo.json --markdown ../docs/ops_coverage.md --known-failures-out ../tests/opinfo_known_failures.txt

# Hugging Face causal-LM architecture sweep (issue #4): every model_type of transformers' causal-LM mapping
# as a tiny random-weight model, vnpu vs CPU (forward, gradients, greedy generate); offline, no downloads.
hf-coverage: install
	mkdir -p $(OUT) && cd $(OUT) && HF_HUB_OFFLINE=1 ../$(PY) ../scripts/hf_coverage.py --jobs 2 --timeout 600 \
	  --json hf_coverage.json --markdown ../docs/hf_coverage.md

# Install check (issue #14): `pip wheel` of this tree, installed with torch==2.13.0 into a fresh venv, imported
# from a temporary directory, the repository root and tests/; a build for another torch refused (~3-6 min).
check-wheel: install
	$(PY) scripts/check_wheel.py

clean:
	rm -rf build $(OUT)
