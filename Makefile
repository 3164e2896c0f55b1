# Every target creates the virtualenv and installs the project when needed, so a fresh
# clone needs nothing but python3.
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

# The dry run on the bundled cluster; some examples are denied on purpose (exit 1).
run: $(STAMP)
	$(BIN)/admit-guard check -f examples/workloads --cluster examples/cluster || [ $$? -eq 1 ]

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/python bench/engine_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
