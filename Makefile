# dtlab: two commands.
#   make lab    set up .venv and open JupyterLab on the lessons
#   make test   set up .venv, lint, and run every test, notebooks included
#
# Lessons are jupytext pairs: notebooks/NN_name.py is the source (open it as a
# notebook in JupyterLab), notebooks/NN_name.ipynb the same cells stored
# executed. After editing a source, `make notebooks LESSONS=notebooks/NN_name.py`
# re-executes it into its .ipynb (all of them without LESSONS: many minutes).
#
# Torch is installed first, on its own, so that pip picks a CPU build where one
# is available locally instead of a multi-GB CUDA build. GPU users: install the
# CUDA build of torch into .venv first (see README), then run make.
#
# The end-to-end browser test (tests/test_browser.py) drives JupyterLab in
# Debian's chromium through playwright (a pip package: playwright never
# downloads a browser here). `make test` installs chromium with apt-get when
# it is missing and it can, and then requires the browser test to run
# (DTLAB_REQUIRE_BROWSER=1) instead of letting it skip.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch>=2.6,<2.14
TORCH_PIP_ARGS ?=
CHROMIUM ?= /usr/bin/chromium

.PHONY: lab test lint notebooks setup browser clean gpu-check

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PY) -m pip install -e ".[test]"
	touch $@

setup: $(VENV)/.installed

lab: $(VENV)/.installed
	$(VENV)/bin/dtlab lab --no-browser $(LAB_ARGS)

browser:
	@if [ -x "$(CHROMIUM)" ]; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "make: installing Debian's chromium for the browser test"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } \
	    || echo "make: could not install chromium; the browser test will be skipped"; \
	else \
	  echo "make: no $(CHROMIUM), and no apt-get as root to install it; the browser test will be skipped"; \
	fi
	@# A Chinese font, so that the test's screenshot shows the lessons' 简体中文 (1.6 MB)
	@if [ -x "$(CHROMIUM)" ] && command -v fc-list >/dev/null 2>&1 && [ -z "$$(fc-list :lang=zh)" ] \
	    && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends fonts-wqy-microhei \
	    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends fonts-wqy-microhei; }; } \
	    || echo "make: could not install a Chinese font; screenshots will show boxes for Chinese text"; \
	fi

# The linter and the formatter first (ruff, configured in pyproject.toml): a lint or format failure fails the run.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: $(VENV)/.installed browser lint
	@$(PY) -c "import playwright" 2>/dev/null || $(PY) -m pip install playwright
	if [ -x "$(CHROMIUM)" ]; then export DTLAB_REQUIRE_BROWSER=1 DTLAB_CHROMIUM="$(CHROMIUM)"; fi; \
	$(PY) -m pytest tests notebooks --nbval --nbval-cell-timeout=900 -q --durations=30

# Each lesson source executed in a fresh kernel as a learner first sees it, stored as its .ipynb.
LESSONS ?= $(sort $(wildcard notebooks/[0-9][0-9]_*.py))
notebooks: $(VENV)/.installed
	$(PY) tools/execute_lessons.py $(LESSONS)

# The GPU report, on a machine with CUDA GPUs (about 3 minutes on one H200): NCCL and every
# layout the GPUs allow, the memory accountant against the CUDA allocator (workspace and the
# first step's extra named), the MFU of a ~100M GPT step by step (eager attention, sdpa, fused
# AdamW, torch.compile, a larger batch) and dtlab's training loop beside a plain PyTorch loop;
# results in notebooks/gpu_check.json. Without a GPU it says what it could not check and exits 2.
gpu-check: $(VENV)/.installed
	timeout 600 $(PY) tools/gpu_check.py

clean:
	rm -rf $(VENV)
