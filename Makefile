# The two commands: `make demo` (the main job) and `make test` (the test suite).
# Both create .venv and install everything on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test venv data lint clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

# Real Fashion-MNIST: Debian's dataset-fashion-mnist when apt is usable, else torchvision's
# downloader, else a message naming where to put the files.
data: venv
	@$(PY) -m edgefl.data.fetch fashion-mnist

demo: venv data
	$(VENV)/bin/edgefl simulate --algorithm fedavg --dataset fashion-mnist --model cnn \
		--clients 10 --rounds 5 --partition dirichlet --alpha 0.5 --seed 0 --run-name demo

test: venv data
	$(PY) -m pytest -q

lint: venv
	$(VENV)/bin/ruff check edgefl tests benchmarks

clean:
	rm -rf runs .pytest_cache
