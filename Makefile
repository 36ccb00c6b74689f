# Two commands do everything on a fresh machine (Python 3.11 and make):
#   make lab    set up .venv if needed, open the course in JupyterLab (127.0.0.1)
#   make test   set up .venv if needed, run every test (unit, scripts under torchrun, nbval)
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.setup-done

.PHONY: setup lab test stress clean

setup: $(STAMP)

# Re-run the install whenever the dependencies change.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	touch $(STAMP)

lab: setup
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.root_dir=. notebooks/00_start_here.ipynb

test: setup
	$(PY) -m pytest

# Not a test: launches a DDP script 200 times and reports the failures (takes ~20 min).
stress: setup
	$(PY) benchmarks/stress_teardown.py --runs 200

clean:
	rm -rf $(VENV)
