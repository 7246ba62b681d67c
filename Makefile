# hpcmem: `make run` (the workflow on this machine) and `make test` (the whole suite).
# Both set up what they need: Debian packages (as root), a venv in .venv, the native build.
# Every step is idempotent and cheap on a second call.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMPS := $(VENV)/.hpcmem
# the editable install maps the package files that exist when it is made: re-make it when any
# source file (native or Python) changes; the CMake build dir is cached, so this takes seconds
PACKAGE_SOURCES := $(shell find native hpcmem -type f -not -path "*/__pycache__/*" -not -name "*.so") pyproject.toml
# From the environment (neither is in the checkout; .ci/run sets both for CI):
# HPCMEM_APPTAINER_INSTALLER, a script that installs Apptainer on this machine (as root,
# idempotent): `make test` runs it when it is set and we are root, so the container tests have
# a real runtime; without one they are skipped, saying why. `make run` never installs it (no
# runtime: the workflow runs natively).
# HPCMEM_OSU_TARBALL, an OSU Micro-Benchmarks 7.x source tarball: `make test` builds it once
# into OSU_DIR (outside the checkout) when it is set, so the OSU comparison test runs against
# real OSU binaries; without it (and without an install already in OSU_DIR) that test is
# skipped, saying why. Point OSU_DIR at a site's install prefix (Spack, modules) to use that
# one instead.
OSU_DIR ?= $(HOME)/.cache/hpcmem/osu-7.4

.PHONY: setup native run test lint bench bench-osu clean container-runtime osu vm-image

setup: $(STAMPS)/system $(STAMPS)/python $(STAMPS)/native

native: $(STAMPS)/native

$(STAMPS)/system: tools/system-packages.txt tools/install-system-packages.sh
	tools/install-system-packages.sh
	mkdir -p $(STAMPS) && touch $@

$(STAMPS)/python: requirements.txt $(STAMPS)/system
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-binary mpi4py mpi4py==4.1.2
	mkdir -p $(STAMPS) && touch $@

$(STAMPS)/native: $(PACKAGE_SOURCES) $(STAMPS)/python
	mkdir -p build && flock build/build.lock $(BIN)/pip install -q --no-build-isolation --no-deps -e .
	touch $@

run: setup
	$(BIN)/hpcmem info
	tools/run-workflow.sh

lint: setup
	$(BIN)/ruff check hpcmem tests benchmarks workflow/scripts examples
	$(BIN)/snakemake --lint --snakefile workflow/Snakefile --directory . --quiet

container-runtime:
	@if [ -x "$(HPCMEM_APPTAINER_INSTALLER)" ] && [ "$$(id -u)" = 0 ]; then \
	  "$(HPCMEM_APPTAINER_INSTALLER)"; \
	else echo "hpcmem: no Apptainer installer run (HPCMEM_APPTAINER_INSTALLER:" \
	  "$(or $(HPCMEM_APPTAINER_INSTALLER),unset); set it to an executable install script" \
	  "and run as root)"; fi

osu:
	@if [ -f "$(HPCMEM_OSU_TARBALL)" ]; then \
	  tools/build-osu.sh "$(HPCMEM_OSU_TARBALL)" "$(OSU_DIR)"; \
	else echo "hpcmem: no OSU tarball (HPCMEM_OSU_TARBALL: $(or $(HPCMEM_OSU_TARBALL),unset);" \
	  "set it to an OSU 7.x source tarball): OSU_DIR=$(OSU_DIR) used as it is"; fi

# the HBM test VMs' boot image, built once into VM_CACHE; the VM tests
# (tests/test_vm_topologies.py) build it themselves when it is missing
VM_CACHE ?= $(or $(HPCMEM_VM_CACHE),$(HOME)/.cache/hpcmem/vm)
vm-image: $(STAMPS)/system
	mkdir -p "$(VM_CACHE)" && flock "$(VM_CACHE)/build.lock" tools/vm/build-image.sh "$(VM_CACHE)"

test: setup lint container-runtime osu
	HPCMEM_OSU_DIR="$(abspath $(OSU_DIR))" PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pytest -q -n 2 --no-loadscope-reorder tests

bench: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python benchmarks/collectives_overhead.py

# OSU C against hpcmem (about 4 minutes on 2 quiet cores): where the gap comes from, then the
# side-by-side table; both write under benchmarks/results/. Exit 1 when a target is missed.
bench-osu: setup osu
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python benchmarks/collectives_gap.py
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python benchmarks/osu_comparison.py --osu-dir "$(OSU_DIR)"

clean:
	rm -rf build .venv results .pytest_cache
