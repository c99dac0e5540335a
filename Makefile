# The two commands: `make demo` (the main job) and `make test` (the test suite).
# Both create .venv and install everything on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test venv data lint clean pi-check dist cli-docs

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip uninstall --quiet --yes edgefl 2>/dev/null || true  # a venv from before the rename to edgefl-toolkit
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[all,dev]'
	@touch $(STAMP)

venv: $(STAMP)

# Real Fashion-MNIST: Debian's dataset-fashion-mnist when apt is usable, else torchvision's
# downloader, else a message naming where to put the files.
data: venv
	@$(PY) -m edgefl.data.fetch fashion-mnist

# The main job: an embedded MQTT broker, the server, and 20 device processes of 5 ResNet depths
# (four per depth, the paper's CIFAR-10 fleet, forked from a fork server that imported torch once)
# training Velo on 18,000 real Fashion-MNIST images, Dir(0.5), 3 local epochs a round with Adam at lr
# 3e-3, x0.1 from round 10, the CVAE trained every second round (chosen on a validation split over
# four seeds: benchmarks/demo/tune.py); Local (the same devices without
# federation) next to it, from benchmarks/demo/ when this configuration was run before; then every
# device's model is exported to ONNX (parity-checked, plus a static int8 copy) and evaluated with
# ONNX Runtime (--export int8: `edgefl export --run runs/demo --all --out runs/demo/onnx
# --quantize int8 --test-samples 2000`, by workers forked from the devices' fork server, which
# has torch loaded).
DEMO := runs/demo
demo: venv data
	@rm -rf $(DEMO) && mkdir -p $(DEMO) && date +%s > $(DEMO)/started-at
	$(VENV)/bin/edgefl simulate --transport mqtt --algorithm velo --dataset fashion-mnist \
		--clients 20 --rounds 12 --partition dirichlet --alpha 0.5 --lr 0.003 --lr-decay-rounds 9 --option cvae_interval=2 \
		--train-samples 18000 --epochs 3 --test-samples 2000 --eval-every 2 --eval-samples 1000 \
		--seed 0 --out runs --run-name demo \
		--compare-local --reference-cache benchmarks/demo --export int8
	$(VENV)/bin/edgefl infer $(DEMO)/onnx/d00.onnx --dataset fashion-mnist --split test --limit 2000
	@echo
	@echo "results: $(DEMO)/summary.md (per round: $(DEMO)/rounds.jsonl)"
	@echo "plots:   $(DEMO)/accuracy.png $(DEMO)/bytes.png"
	@echo "onnx:    $(DEMO)/onnx/ (fp32 and int8 per device)"
	@echo "took $$(( $$(date +%s) - $$(cat $(DEMO)/started-at) )) s on $$(nproc) cores; load average now: $$(cut -d' ' -f1-3 /proc/loadavg)"

# The system packages the tests need (mosquitto, chromium, systemd-analyze, the data) are
# installed first when apt is usable and this runs as root (tests/system-packages.sh), else
# named. The suite in parallel (pytest-xdist): one worker per core, at most 4 (tests start processes of
# their own). A file's tests stay in one worker, except those tests/conftest.py lets spread (SPREAD);
# the longest files go first (their seconds in tests/durations.json: `pytest --write-durations`).
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
test: venv data
	@bash tests/system-packages.sh
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The emulated Raspberry Pi check (root; slow, not part of CI): benchmarks/pi/results.md.
pi-check: venv
	bash benchmarks/pi/run.sh

# The sdist and the wheel of edgefl-toolkit, into dist/ (what docs/install-pi-jetson.md copies to a device).
dist: venv
	rm -rf dist build && $(PY) -m build --outdir dist .
	@ls -l dist

# The CLI reference (cli/README.md) and shell completions (cli/completion/), generated from the
# Typer app; tests/test_cli_docs.py fails when they drift from the code.
cli-docs: venv
	$(PY) -m edgefl.cli.reference cli

lint: venv
	$(VENV)/bin/ruff check edgefl tests benchmarks

clean:
	rm -rf runs .pytest_cache
