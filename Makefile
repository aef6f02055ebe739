# Two commands matter: `make demo` and `make test`. Both work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS ?= local,dev,bench,ray,verifiers,serve,otel,search

.PHONY: install system model demo test test-fast lint bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	@touch $@

install: system $(STAMP)

# bubblewrap isolates the sandbox (without it recursa runs with resource limits only and says so);
# chromium + chromedriver let the tests open the trace viewer in a real browser; g++ builds the
# local llama.cpp runtime; qemu-user lets the tests run it on an emulated CPU without AVX-512/AMX.
SYSTEM_PKGS := bubblewrap chromium chromium-driver g++ qemu-user
system:
	@missing=""; for p in $(SYSTEM_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "note: missing system packages:$$missing (sudo apt-get install$$missing)"; fi; \
	fi

# The local runtime (llama.cpp's server, built once for a portable CPU profile, about 5.5 minutes on
# 2 cores) and the models: the default 1.5B, and the tiny one the portability test emulates.
model: install
	$(BIN)/recursa runtime build
	$(BIN)/recursa models fetch qwen2.5-coder-1.5b
	$(BIN)/recursa models fetch smollm2-135m
	$(BIN)/recursa runtime check --model smollm2-135m   # a 2-token generation on this CPU

demo: model
	$(BIN)/python examples/demo.py

lint: install
	$(BIN)/ruff check src tests $(wildcard benchmarks examples)
	$(BIN)/mypy

test: model lint
	$(BIN)/python -m pytest -m "" -q -p no:cacheprovider

test-fast: install
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
