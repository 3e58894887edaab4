# Two commands do all the set-up: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test bench clean venv

venv: $(STAMP)

# Reinstall when the project metadata changes; the editable install keeps
# src/ live, so code edits need no reinstall.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/overlay demo cluster_configs/local.toml

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/matching.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
