# lhc-ina: `make demo` and `make test` work from a clean clone; each creates .venv and installs what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Pinned so that machines holding the local CPU wheel use it instead of pulling CUDA packages.
TORCH_SPEC ?= torch==2.13.0
INSTALLED := $(VENV)/.installed
P4C ?= p4c
BF_P4C ?= bf-p4c
P4_BUILD := build/p4
TARGET ?= softswitch
PYTEST_ARGS ?=
# `make test` runs pytest on this many processes (pytest-xdist; 0: one process). conftest.py keeps each
# module's tests on one worker and the tests that use the host's network (veths, Mininet) on one worker,
# and puts the groups with the most `slow` tests first.
TEST_WORKERS ?= 2
# e.g. make demo DEMO_ARGS='--workers 2 --steps 10'
DEMO_ARGS ?=

.PHONY: venv demo test lint bench p4 p4-v1model p4-tna p4-p4info p4-constants p4-check system-deps clean emulate-train emulate-bmv2 \
	wireshark-dissector wireshark-check test-tools gpu-check gpu-wheels

venv: $(INSTALLED)

# The C extensions are optional (each has a Python fallback): a failed build would leave an older one in
# place, so each is removed first and a missing one is reported (its tests then fail or say so).
NATIVE_MODULES := host_agent/codec/cpu/_kernels lhc_ina/_udp host_agent/transport/_engine softswitch/_dataplane
NATIVE_SOURCES := $(wildcard host_agent/codec/cpu/*.[ch] host_agent/transport/*.c \
	host_agent/transport/*.h softswitch/*.[ch] lhc_ina/*.[ch])
$(INSTALLED): pyproject.toml setup.py $(NATIVE_SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	for module in $(NATIVE_MODULES); do rm -f $$module.*.so; done
	$(PY) -m pip install -q -e '.[dev]'
	@for module in $(NATIVE_MODULES); do ls $$module.*.so >/dev/null 2>&1 || echo "warning: $$module did" \
		"not build (no C compiler or Python headers?): its Python fallback runs, slower"; done
	touch $@

demo: venv
	$(PY) -m lhc_demo.train $(DEMO_ARGS)

test: venv p4-check wireshark-check test-tools
	$(PY) -m ruff check .
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)

lint: venv
	$(PY) -m ruff check .

bench: venv
	mkdir -p build && $(VENV)/bin/lhc-bench codec --sweep --plot build/codec-sweep.png
	$(VENV)/bin/lhc-bench switch --json
	$(VENV)/bin/lhc-bench aggregate --density 0.001,0.01,0.05 --workers 8 --json --plot build/aggregate.png

# The P4 include generated from lhc_ina/constants.py (the single source of protocol constants).
p4-constants:
	$(PYTHON) -m lhc_ina.p4gen

p4-check:
	$(PYTHON) -m lhc_ina.p4gen --check

# The Wireshark dissector generated from lhc_ina/constants.py and lhc_ina/wire.py (as the P4 include is).
wireshark-dissector: venv
	$(PY) -m lhc_ina.wiresharkgen

wireshark-check: venv
	$(PY) -m lhc_ina.wiresharkgen --check

# tshark, for the dissector's tests (tests/test_wireshark_capture.py): installed from the Debian packages
# where it is missing and apt-get can run (root). Never fails: without it those tests skip and say why.
TSHARK_DEBCONF := wireshark-common wireshark-common/install-setuid boolean false
test-tools:
	@command -v tshark >/dev/null && exit 0; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
		echo "make test: tshark not found and apt-get cannot install it here (needs root on Debian):" \
			"the Wireshark dissector tests will skip"; exit 0; fi; \
	echo "$(TSHARK_DEBCONF)" | debconf-set-selections 2>/dev/null; \
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tshark >/dev/null 2>&1 \
		|| { apt-get update -qq >/dev/null 2>&1 && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tshark >/dev/null 2>&1; } \
		|| echo "make test: installing tshark failed: the Wireshark dissector tests will skip"

# `make p4-v1model` / `make p4-tna` compile one program and fail when its compiler is missing. `make p4`
# compiles both with whichever compilers are installed, names each program it skipped, and fails when it
# compiled nothing. The v1model P4Info p4c writes is compared with the committed one (`make p4-p4info`
# adopts the compiler's).
p4: p4-constants
	@built=0; \
	if command -v $(P4C) >/dev/null; then $(MAKE) --no-print-directory p4-v1model || exit 1; built=1; \
	else echo "make p4: skipped the v1model program: p4c not found on PATH ($(P4C))"; fi; \
	if command -v $(BF_P4C) >/dev/null; then $(MAKE) --no-print-directory p4-tna || exit 1; built=1; \
	else echo "make p4: skipped the TNA program: bf-p4c not found on PATH ($(BF_P4C))"; fi; \
	if [ $$built = 0 ]; then echo "make p4: no P4 compiler found: nothing was compiled" >&2; exit 1; fi

p4-v1model: p4-constants
	@command -v $(P4C) >/dev/null || { echo "make p4-v1model: p4c not found on PATH ($(P4C))" >&2; exit 1; }
	mkdir -p $(P4_BUILD)/v1model
	$(P4C) --target bmv2 --arch v1model -o $(P4_BUILD)/v1model \
		--p4runtime-files $(P4_BUILD)/v1model/lhc.p4info.txtpb p4src/v1model/lhc.p4
	@echo "v1model: $(P4_BUILD)/v1model/lhc.json"
	@if cmp -s $(P4_BUILD)/v1model/lhc.p4info.txtpb p4src/v1model/lhc.p4info.txtpb; then \
		echo "v1model: committed P4Info is current"; \
	else echo "v1model: P4Info differs from p4src/v1model/lhc.p4info.txtpb (make p4-p4info adopts it)"; fi

p4-tna: p4-constants
	@command -v $(BF_P4C) >/dev/null || { echo "make p4-tna: bf-p4c not found on PATH ($(BF_P4C))" >&2; exit 1; }
	mkdir -p $(P4_BUILD)/tna
	$(BF_P4C) --target tofino --arch tna -o $(P4_BUILD)/tna \
		--p4runtime-files $(P4_BUILD)/tna/lhc.p4info.txtpb --p4runtime-force-std-externs p4src/tna/lhc.p4
	@echo "tna: $(P4_BUILD)/tna"
	$(PYTHON) -m lhc_ina.tofino $(P4_BUILD)/tna

p4-p4info: p4-v1model
	cp $(P4_BUILD)/v1model/lhc.p4info.txtpb p4src/v1model/lhc.p4info.txtpb

# Emulation (root, Mininet: `make system-deps`): the demo's training in a 4-host star on 20 Mbit/s links,
# DDP allreduce against lhc through softswitch; and a short run through BMv2 where it is installed.
# One of the paper's models every way lhc-bench train runs it: EMULATE_ARGS='--model vgg19 --bw 1000 --steps 4'.
EMULATE_ARGS ?=
emulate-train: venv
	/usr/bin/python3 mininet/run.py --workers 4 --bw 20 --steps 10 $(EMULATE_ARGS)

emulate-bmv2: venv
	@command -v simple_switch_grpc >/dev/null && command -v $(P4C) >/dev/null || { echo "make emulate-bmv2:" \
		"needs simple_switch_grpc and p4c on PATH (build BMv2 and p4c from their sources)" >&2; exit 1; }
	$(MAKE) --no-print-directory p4-v1model
	/usr/bin/python3 mininet/run.py --switch bmv2 --workers 2 --bw 0 --steps 2 --users 500 --items 500 \
		--out build/emulation-bmv2 $(EMULATE_ARGS)
	/usr/bin/python3 mininet/run.py --switch bmv2 --workers 2 --bw 0 --workload bench --length 20000 \
		--out build/emulation-bmv2 $(EMULATE_ARGS)

# Debian packages for the emulation tests (Mininet and friends; tcpdump for mininet/run.py --pcap) and
# tshark for the dissector's tests; the tests that need them call this.
system-deps:
	@if [ "$$(id -u)" != 0 ]; then echo "system-deps needs root (apt-get)"; exit 1; fi
	apt-get update -qq
	echo "$(TSHARK_DEBCONF)" | debconf-set-selections
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mininet bridge-utils iputils-ping iproute2 ethtool \
		nftables tcpdump tshark

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache .hypothesis
	for module in $(NATIVE_MODULES); do rm -f $$module.*.so; done
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# The PTF suite against a target (root: veth pairs): `make ptf` (softswitch), `make ptf TARGET=bmv2`,
# `make ptf PIPELINE=python` (softswitch's pipeline; its default, native where built, when left out).
PIPELINE ?=
.PHONY: ptf
ptf: venv
	$(PY) -m ptf_tests.run --target $(TARGET) $(if $(PIPELINE),--pipeline $(PIPELINE))

# The controller's job service stubs, committed. grpcio-tools 1.49.1's protoc writes code the pinned
# protobuf 3.20 runtime loads (newer ones need protobuf >= 4); it runs in its own throwaway venv.
.PHONY: controller-stubs
controller-stubs:
	test -x build/stubs-venv/bin/python || $(PYTHON) -m venv build/stubs-venv
	build/stubs-venv/bin/pip install -q grpcio-tools==1.49.1
	build/stubs-venv/bin/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. \
		lhc_ina/jobservice/jobservice.proto

# The device check (benchmarks/gpu_check.py): on a GPU machine, with the machine's own python3 and torch
# (never this venv's), the wheels below from $(WHEELS) and the C extensions built in place; it writes
# $(OUT)/summary.json and summary.txt. On a CPU machine the device steps say they were skipped.
# `make gpu-wheels` downloads the wheels (for CPython 3.12, pure Python) into the ignored $(WHEELS).
OUT ?= build/gpu-check
WHEELS ?= .whl
GPU_PYTHON ?= python3
GPU_CHECK_ARGS ?=
GPU_WHEELS := protobuf==3.20.3 p4runtime==1.5.0 googleapis-common-protos==1.73.0 prometheus_client==0.26.0 \
	scapy==2.8.0 pyroute2==0.9.7
GPU_WHEEL_PLATFORM := --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
	--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
gpu-check:
	$(GPU_PYTHON) -m benchmarks.gpu_check --out $(OUT) --wheels $(WHEELS) $(GPU_CHECK_ARGS)

gpu-wheels:
	mkdir -p $(WHEELS)
	for spec in $(GPU_WHEELS); do $(PYTHON) -m pip download -q --no-deps --only-binary=:all: \
		$(GPU_WHEEL_PLATFORM) -d $(WHEELS) $$spec || exit 1; done
	@du -sh $(WHEELS)
