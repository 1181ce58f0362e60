# Each user-facing target creates/refreshes .venv and installs the project with pinned dependencies.
# `make demo` installs only the package and its runtime dependencies; the test targets add the test extras
# (pytest, hypothesis, Ray) on top, recorded by a second stamp.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
OUT ?= out

.PHONY: venv demo test test-slow bench clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt -e .
	@touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	@touch $(TEST_STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/mcdla reproduce --out $(OUT)

test: $(TEST_STAMP)
	$(BIN)/python -m pytest

test-slow: $(TEST_STAMP)
	$(BIN)/python -m pytest -m slow; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ]

bench: $(TEST_STAMP)
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
