# Two commands do all the set-up: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed
# The compiled build (README "Compiled build"): the last build's stamp, and
# the marker `make pure` leaves so that later builds stay pure.
BUILT  := $(VENV)/.built
PURE_MARK := $(VENV)/.pure
# The sources setup.py compiles (overlay.build.HOT_MODULES): an edit to one
# rebuilds; until then overlay.build rule 2 runs the tree as pure Python.
HOT_SOURCES := $(shell $(PYTHON) -c 'import runpy; print(" ".join("src/" + m.replace(".", "/") + ".py" for m in runpy.run_path("src/overlay/build.py")["HOT_MODULES"]))')
# The node's line saying which build runs (overlay.build rule 3).  PYTHONPATH:
# this tree's src, whatever the virtualenv's editable install points at.
SAY_BUILD := PYTHONPATH=src $(BIN)/python -c "import overlay.build as b; print('overlay build:', b.BUILD)"
IS_COMPILED := PYTHONPATH=src $(BIN)/python -c "import sys, overlay.build as b; sys.exit(not b.BUILD.startswith('compiled'))"
# What `make test` also runs as pure Python when the suite ran compiled
# (overlay.build rule 7): the simulator, and the unit tests of the hot modules
# whose pure-Python behaviour the compiled run did not exercise — the codec,
# matching, the node core, the queues, the fast paths held to the general ones,
# and the seams check (test_seams guards only pure classes).  About 1 minute.
PURE_TESTS := tests/test_build.py tests/test_codec.py tests/test_codec_notify.py tests/test_matcher.py \
	tests/test_channel.py tests/test_node_core.py tests/test_node_core_failed_publish.py tests/test_queues.py tests/test_dedup.py tests/test_histograms.py \
	tests/test_simulation.py tests/test_sim_faults.py tests/test_sim_inbox.py tests/test_sim_notifies.py \
	tests/test_seams.py tests/test_outbox_inline.py tests/test_router_fast.py tests/test_event_id.py tests/test_dispatch_now.py tests/test_event_check.py

.PHONY: run test lint bench clean venv browser java fast pure

# The virtualenv, and the compiled build in it when a C compiler is there.
venv: $(STAMP) $(BUILT)

# Reinstall when the project metadata changes; the editable install keeps
# src/ live, so code edits need no reinstall.  Everything a developer runs:
# the tests, the linters, and the replay extra (pyspark, matplotlib) that
# `overlay replay` and tests/test_replay.py need.  (`pip install .` alone is
# a node, its client and the CLI, without Spark.)  The install itself is pure
# Python (OVERLAY_COMPILE=0); the compiled modules are built next to their
# sources below.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	OVERLAY_COMPILE=0 $(BIN)/python -m pip install --quiet -e '.[test,lint,replay]'
	touch $(STAMP)

# The build users get (README "Compiled build"): the hot modules compiled
# with mypyc in place when a C compiler is there (about 1 minute on 2 quiet
# cores), pure Python when not or when the compilation fails (setup.py says
# why), or after `make pure`.  Either way the last line says which build runs.
$(BUILT): $(STAMP) setup.py src/overlay/build.py $(HOT_SOURCES)
	@if [ -f $(PURE_MARK) ]; then echo "overlay: pure Python kept (make pure); make fast compiles"; \
	else echo "overlay: compiling the hot modules with mypyc (OVERLAY_COMPILE=auto) ..."; \
	  OVERLAY_COMPILE=auto $(BIN)/python setup.py --quiet build_ext --inplace >$(VENV)/build.log 2>&1 || \
	  { tail -20 $(VENV)/build.log; exit 1; }; grep '^overlay:' $(VENV)/build.log || true; fi
	@$(SAY_BUILD)
	@touch $(BUILT)

# Compiled, or fail (OVERLAY_COMPILE=1), and compiled from now on.
fast: $(STAMP)
	rm -f $(PURE_MARK)
	OVERLAY_COMPILE=1 $(BIN)/python setup.py --quiet build_ext --inplace
	@$(SAY_BUILD)
	@touch $(BUILT)

# Back to pure Python, and kept so by `make venv` until `make fast`.
pure:
	rm -f src/overlay__mypyc.*.so src/overlay/_compiled.json
	find src/overlay -name '*.so' -delete
	@mkdir -p $(VENV) && touch $(PURE_MARK)
	@[ ! -x $(BIN)/python ] || $(SAY_BUILD)

# TLS by default: the development CA and certificates local.toml names are
# made on first use, into git-ignored cluster_configs/certs (kept after that).
run: venv
	$(BIN)/overlay certs dev cluster_configs/certs --config cluster_configs/local.toml
	$(BIN)/overlay demo cluster_configs/local.toml

# The whole suite on the build users get (compiled when a C compiler is
# there); when that was the compiled one, PURE_TESTS again as pure Python.
test: venv browser java
	@$(SAY_BUILD)
	$(BIN)/python -m pytest -q
	@if $(IS_COMPILED); then echo "overlay build: pure Python (OVERLAY_PURE=1) for the simulator and the hot modules' unit tests"; \
	  OVERLAY_PURE=1 $(BIN)/python -m pytest -q $(PURE_TESTS); fi

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
	OVERLAY_COMPILE=0 $(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

# On the build users get (make venv), as they run it: bench/throughput.py rule 11.
bench: $(BENCH_STAMP) venv
	$(BIN)/python bench/matching.py
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/agent.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
	rm -f src/overlay__mypyc.*.so src/overlay/_compiled.json
	find src/overlay -name '*.so' -delete
