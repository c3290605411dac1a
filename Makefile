# The README's two commands. Each one creates or updates .venv (idempotent), then runs.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test lint docs bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -c constraints.txt -e '.[dev,serve,docs]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/vitlab demo $(ARGS)

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadfile $(ARGS)

# ruff's formatter (checked, not applied: `ruff format` applies it) and its linter, as pyproject.toml configures them
lint: $(STAMP)
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/ruff check src tests benchmarks

# the documentation site: docs/ -> site/ (open site/index.html); --strict fails on a broken link or a page left out
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# benchmarks/bench_core.py: 10+ minutes on a 2-core CPU; `make bench ARGS=--quick` is a smoke run of about a minute
bench: $(STAMP)
	$(VENV)/bin/python benchmarks/bench_core.py $(ARGS)

clean:
	rm -rf $(VENV) runs site
