# Two commands do everything on a fresh machine (Python 3.11 and make):
#   make lab    set up .venv if needed, open the course in JupyterLab (127.0.0.1)
#   make test   set up .venv if needed, run every test (unit, scripts under torchrun, nbval)
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.setup-done

.PHONY: setup browser slurm system-packages lab test execute cost stress gpu-check compat site clean

setup: $(STAMP)

# Re-run the install whenever the dependencies change.
# uv installs the same pins as pip would, in half the time here (about 50 s, not 100 s): it unpacks torch's ~6 GB of
# wheels and byte-compiles on every core. Byte-compiling matters: a venv without .pyc files (PYTHONDONTWRITEBYTECODE
# is common) compiles torch again on every import. Where uv cannot be had, or fails (no PyPI, an index only pip's
# config knows), pip installs instead, and compileall uses every core (a few files are for newer Pythons and fail).
UV = uv==0.13.9
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# TMPDIR: uv leaves a lock file behind in its temporary directory; let that be the venv's, not /tmp.
	$(PY) -m pip install --quiet --disable-pip-version-check $(UV) && mkdir -p $(VENV)/tmp \
	  && TMPDIR=$(abspath $(VENV))/tmp $(VENV)/bin/uv pip install --quiet --python $(PY) --compile-bytecode \
	     -c constraints.txt -e '.[course,test,site]' \
	  || { echo "uv failed: installing with pip" \
	       && $(PY) -m pip install --quiet --disable-pip-version-check --no-compile -c constraints.txt -e '.[course,test,site]' \
	       && { $(PY) -m compileall -q -j 0 $(VENV)/lib >/dev/null || true; }; }
	touch $(STAMP)

# JupyterLab's first screen would ask "get notified about official Jupyter news?": answered "no" here, in the defaults
# of this venv's JupyterLab (overrides.json), so the learner's first screen is lesson 00. No news and no update checks
# also mean no network. A learner's own settings still win over these defaults.
LAB_OVERRIDES = $(VENV)/share/jupyter/lab/settings/overrides.json
$(LAB_OVERRIDES): $(STAMP) Makefile
	mkdir -p $(dir $@)
	printf '%s\n' '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' > $@

lab: setup $(LAB_OVERRIDES)
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.root_dir=. --ServerApp.allow_root=True notebooks/00_start_here.ipynb

# The browser test drives Debian's chromium (never a downloaded browser). Install it where
# we can (root with apt-get, as in CI); elsewhere the browser test skips with one line.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
	  || echo "chromium could not be installed here: the browser test will be skipped"

# Lesson 10's test submits the sbatch templates to a real Slurm on this machine (Debian's slurm-wlm and
# munge; ddp_scripts/slurm/local_cluster.sh brings it up and down). Installed where we can, as chromium is.
slurm:
	@command -v sbatch >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] \
	  && command -v apt-get >/dev/null 2>&1 && apt-get update -qq && apt-get install -y -qq slurm-wlm munge >/dev/null; } \
	  || echo "Slurm could not be installed here: the Slurm test will be skipped"

# What the tests need from Debian, both of the above in one apt-get run (one package index update, not two: CI's
# fresh machine pays each), where we can; elsewhere the browser and Slurm tests skip with one line each.
system-packages:
	@missing=""; command -v chromium >/dev/null 2>&1 || missing="chromium"; \
	{ command -v sbatch >/dev/null 2>&1 && command -v munged >/dev/null 2>&1; } || missing="$$missing slurm-wlm munge"; \
	[ -z "$$missing" ] || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && apt-get update -qq && apt-get install -y -qq $$missing >/dev/null; } \
	  || echo "could not install$$missing here: the tests that need them will be skipped"

# Two pytest-xdist workers: two groups of notebooks, each in order on one worker, and whole test files on whichever
# is free (tests/conftest.py). Alone, the suite keeps about 1.3 of the 2 cores busy (it waits on timeouts, Slurm,
# the browser); two workers about 1.75.
# Ends with "where the time went": the total, the slowest tests and each notebook (artifacts/durations.json).
test: setup system-packages
	$(PY) -m pytest -n 2

# Regenerate a notebook's committed outputs as the tests run it (CPU pins, scratch paths cleared first, what nbval
# skips left as it is, no execution timestamps): make execute NB=notebooks/08_syncbatchnorm.ipynb, or every notebook
# in course order with no NB. Then read its git diff: only what really varies should move.
execute: setup
	$(PY) tests/execute_notebooks.py $(NB)

# What one lesson costs, e.g. make cost LESSON="notebooks/07_checkpoints.ipynb tests/test_checkpoints.py"
cost: setup
	$(PY) -m pytest $(LESSON)  # one process: each duration is the lesson's own, not shared with a neighbour

# Not a test: launches a DDP script 200 times and reports the failures (takes ~20 min).
stress: setup
	$(PY) benchmarks/stress_teardown.py --runs 200

# Not part of make test: on a machine with a GPU, runs every notebook that has a GPU-only cell and writes what
# each such cell printed to notebooks/gpu_report.md (lessons/gpu_check.py). Without CUDA it says so and exits 0.
gpu-check: setup
	$(PY) -m lessons.gpu_check

# The template, two exercise checks and the doctor on torch 2.4 and the newest torch, each in its own venv in
# .compat/ with the tools installed from the course's wheel, and run from a folder outside the checkout, as a learner
# would in a project of their own (uv's cache keeps the wheels). Not part of make test.
compat: setup
	$(PY) benchmarks/compat.py

# The course as a static site in site/ (book/build.py): the committed notebooks as they are, never executed, and no
# network when it is built or read (the widgets' JavaScript is kept in book/vendor/). Open site/index.html, or serve
# it: python -m http.server -d site.
site: setup
	$(PY) book/build.py

clean:
	rm -rf $(VENV)
