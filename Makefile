# Two commands do all the set-up: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed

.PHONY: run test lint bench clean venv browser java fast pure test-compiled

venv: $(STAMP)

# Reinstall when the project metadata changes; the editable install keeps
# src/ live, so code edits need no reinstall.  Everything a developer runs:
# the tests, the linters, and the replay extra (pyspark, matplotlib) that
# `overlay replay` and tests/test_replay.py need.  (`pip install .` alone is
# a node, its client and the CLI, without Spark.)
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	OVERLAY_COMPILE=0 $(BIN)/python -m pip install --quiet -e '.[test,lint,replay]'
	touch $(STAMP)

# The compiled build (README "Compiled build"): the hot modules of
# overlay.build compiled with mypyc, in place, next to their sources.  An
# edited source then runs as pure Python (the node's log line says so) until
# `make fast` again; `make pure` removes the compiled modules.  The development
# install above stays pure (OVERLAY_COMPILE=0): src/ is live.
fast: $(STAMP)
	OVERLAY_COMPILE=1 $(BIN)/python setup.py --quiet build_ext --inplace
	@PYTHONPATH=src $(BIN)/python -c "import overlay.build as b; print('overlay:', b.BUILD)"

pure:
	rm -f src/overlay__mypyc.*.so src/overlay/_compiled.json
	find src/overlay -name '*.so' -delete

# The whole suite against the compiled build (make test runs it pure).
test-compiled: fast browser java
	$(BIN)/python -m pytest -q

# TLS by default: the development CA and certificates local.toml names are
# made on first use, into git-ignored cluster_configs/certs (kept after that).
run: $(STAMP)
	$(BIN)/overlay certs dev cluster_configs/certs --config cluster_configs/local.toml
	$(BIN)/overlay demo cluster_configs/local.toml

test: $(STAMP) browser java
	$(BIN)/python -m pytest -q

# Static checks, configured in pyproject.toml: lint rules, formatting, types.
lint: $(STAMP)
	$(BIN)/ruff check src tests bench spark
	$(BIN)/ruff format --check src tests bench spark
	$(BIN)/mypy

# tests/test_web.py drives Debian's Chromium through selenium: installed once,
# when missing (as root, or with password-less sudo); where it cannot be, the
# browser test skips and says why.
APT := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n) apt-get
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { $(APT) update -qq && DEBIAN_FRONTEND=noninteractive $(APT) install -y -qq chromium chromium-driver >/dev/null; } || \
	  echo "chromium could not be installed: tests/test_web.py will skip"

# Spark (overlay replay, tests/test_replay.py) runs on a Java runtime: on a
# fresh machine without `java`, openjdk-17-jre-headless is installed with
# apt-get (as root, or with password-less sudo).  No fallback: the Spark
# tests need it.
java:
	@command -v java >/dev/null || \
	  { echo "installing openjdk-17-jre-headless for Spark"; $(APT) update -qq && \
	    DEBIAN_FRONTEND=noninteractive $(APT) install -y -qq openjdk-17-jre-headless >/dev/null; }

# The bench extra: MQTT peers (paho-mqtt, amqtt) and py-spy.  bench/throughput.py
# also installs Mosquitto with apt-get when it is missing.
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

# On the compiled build (make fast), as users run it: bench/throughput.py rule 11.
bench: $(BENCH_STAMP) fast
	$(BIN)/python bench/matching.py
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/agent.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
	rm -f src/overlay__mypyc.*.so src/overlay/_compiled.json
	find src/overlay -name '*.so' -delete
