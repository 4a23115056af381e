# dtlab: two commands.
#   make lab    set up .venv and open JupyterLab on the lessons
#   make test   set up .venv and run every test, notebooks included
#
# Torch is installed first, on its own, so that pip picks a CPU build where one
# is available locally instead of a multi-GB CUDA build. GPU users: install the
# CUDA build of torch into .venv first (see README), then run make.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch>=2.4,<2.14
TORCH_PIP_ARGS ?=

.PHONY: lab test setup clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PY) -m pip install -e ".[test]"
	touch $@

setup: $(VENV)/.installed

lab: $(VENV)/.installed
	$(VENV)/bin/dtlab lab --no-browser

test: $(VENV)/.installed
	$(PY) -m pytest tests notebooks --nbval --nbval-cell-timeout=900 -q

clean:
	rm -rf $(VENV)
