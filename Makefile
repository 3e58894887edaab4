# Two commands do all the set-up: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed

.PHONY: run test lint bench clean venv browser java

venv: $(STAMP)

# Reinstall when the project metadata changes; the editable install keeps
# src/ live, so code edits need no reinstall.  Everything a developer runs:
# the tests, the linters, and the replay extra (pyspark, matplotlib) that
# `overlay replay` and tests/test_replay.py need.  (`pip install .` alone is
# a node, its client and the CLI, without Spark.)
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,lint,replay]'
	touch $(STAMP)

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

bench: $(BENCH_STAMP)
	$(BIN)/python bench/matching.py
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/agent.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
