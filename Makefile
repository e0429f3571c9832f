# The README's test command is `make test`: it sets everything up from a fresh clone, then runs
# ruff, mypy (strict) and pytest. CI runs exactly that through .ci/run.
# Python 3.13 (azure-functions 2.x and the azure-functions-runtime worker library); the first that runs.
PYTHON ?= $(firstword $(foreach p,python3.13 $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3.13) \
	/usr/local/bin/python3.13 /usr/bin/python3.13,$(if $(shell $(p) -c 'import sys' 2>/dev/null && echo ok),$(p))))
VENV := .venv
BIN := $(VENV)/bin
UV := $(BIN)/uv
CHECKOV_VENV := .venv-checkov
DOCS_VENV := .venv-docs
COSMOS_DIR := tools/devservers/cosmos
AZURITE_DIR := tools/devservers/azurite

.PHONY: test setup installs lint typecheck pytest lock lock-check run demo chaos bench cosmos-server azurite docs servicebus-server checkov simulate simulate-payments clean

# mypy beside pytest, not before it: pytest leaves the 2 cores about 15% idle, time mypy's half-minute fits into.
test: setup lint
	@$(MAKE) --no-print-directory -j2 typecheck pytest

# The installs side by side, once uv is in .venv: 35 to 45 s from a fresh clone here, with uv's and npm's caches warm.
setup:
	@$(MAKE) --no-print-directory -j5 installs

installs: $(VENV)/.installed $(CHECKOV_VENV)/.installed $(DOCS_VENV)/.installed $(COSMOS_DIR)/node_modules/.installed \
		$(AZURITE_DIR)/node_modules/.installed
	@:

# uv (pinned in requirements-dev.txt) is pip-installed once, into .venv, and makes and fills all three venvs:
# .venv-checkov and .venv-docs are uv's venvs, without pip (nothing runs pip in them). A venv of python -m venv and
# a pip install of uv into it took 6 CPU-s each, on a 2-core machine whose setup is CPU-bound.
$(UV): requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$$(grep -m1 '^uv==' requirements-dev.txt)"
	touch $@

# No venv's install compiles its packages to bytecode (uv does not by default): compiling all of .venv's at install
# (--compile-bytecode) took 20 of a fresh clone's 70 CPU-s of setup here, and most of it is never imported (pip,
# setuptools, mypy's sources, most of numpy and fontTools). The pytest target's collection compiles what the tests
# import, and the hosts' and workers' own first imports the rest (the worker library, matplotlib), once each.
# The test environment runs exactly what is deployed: requirements-dev.txt (the tools' and tests' pins, and the
# app's ranges through tools/requirements.txt) under the constraint of requirements.txt, the app's lock. The tools
# (tools/*) are installed into the venv by a path file, so that `.venv/bin/python -m sbctl ...`, `-m devservers.host`,
# `-m simulation` and the rest run from the root.
$(VENV)/.installed: requirements.txt requirements.in tools/requirements.txt requirements-dev.txt $(UV)
	$(UV) pip install --quiet --python $(BIN)/python -r requirements-dev.txt -c requirements.txt
	$(BIN)/python -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "idempotent_consumer_tools.pth").write_text(str(pathlib.Path("tools").resolve()) + "\n")'
	touch $@

$(CHECKOV_VENV)/.installed: requirements-checkov.txt $(UV)
	test -x $(CHECKOV_VENV)/bin/python || $(UV) venv --quiet --python $(PYTHON) $(CHECKOV_VENV)
	$(UV) pip install --quiet --python $(CHECKOV_VENV)/bin/python -r requirements-checkov.txt
	touch $@

# The docs site's tools (requirements-docs.txt), in a venv of their own; tests/unit/test_docs_site.py builds the
# site with --strict from it.
$(DOCS_VENV)/.installed: requirements-docs.txt $(UV)
	test -x $(DOCS_VENV)/bin/python || $(UV) venv --quiet --python $(PYTHON) $(DOCS_VENV)
	$(UV) pip install --quiet --python $(DOCS_VENV)/bin/python -r requirements-docs.txt
	touch $@

$(COSMOS_DIR)/node_modules/.installed: $(COSMOS_DIR)/package.json $(COSMOS_DIR)/package-lock.json
	npm ci --prefix $(COSMOS_DIR) --prefer-offline --no-audit --no-fund --loglevel=error
	touch $@

# Azurite 3.35.0, the last release that runs on Node 20 (tools/devservers/azurite/package.json).
$(AZURITE_DIR)/node_modules/.installed: $(AZURITE_DIR)/package.json $(AZURITE_DIR)/package-lock.json
	npm ci --prefix $(AZURITE_DIR) --prefer-offline --no-audit --no-fund --loglevel=error
	touch $@

# The lock of the deployed dependencies (docs/deploy.md): `make lock` after changing requirements.in;
# `make lock-check` fails when requirements.txt is not the lock uv makes from requirements.in.
lock: setup
	$(BIN)/python -m deps lock

lock-check: setup
	$(BIN)/python -m deps check

lint: setup
	$(BIN)/ruff check .

typecheck: setup
	$(BIN)/mypy

# Bytecode is written whatever PYTHONDONTWRITEBYTECODE says (set on the CI machine; an empty value is unset):
# otherwise each of the hundreds of Python processes the tests start (hosts, workers, the tools) compiled from source
# again what was not compiled (1.6 s of CPU a host for the SDKs), and each of the 6 workers rewrote every test
# module's asserts again (7 s of CPU a worker). The project's modules are compiled first (__pycache__ is ignored by
# git), then one collection writes the rewritten test modules and compiles the packages they import, which the
# workers and the processes they start then read. Its output goes
# nowhere; the run after it reports what it reports.
pytest: export PYTHONDONTWRITEBYTECODE :=
pytest: setup
	$(BIN)/python -m compileall -q -j 0 -x node_modules idempotent_consumer shared consumers tools examples function_app.py
	$(BIN)/python -m pytest --collect-only -q -p no:cacheprovider > /dev/null || true
	$(BIN)/python -m pytest -n 6 --dist loadgroup --durations=12

# The whole local stack in the foreground: broker, Cosmos server, Azurite, fulfilment stand-in and the app on the
# local Functions host (tools/devservers/host), on local.settings.sample.json's ports. Ctrl-C stops it all.
run: setup
	$(BIN)/python -m devservers.run

# The main job in one command: the local stack, three competing hosts, a realistic scenario (ORDERS,
# SEED), a report with its invariants (exit 1 if one fails), results/demo/demo.{json,png}.
ORDERS ?= 2000
SEED ?= 1
demo: setup
	$(BIN)/python -m demo --orders $(ORDERS) --seed $(SEED) $(DEMO_ARGS)

# Proof under faults over the real stack: 4 competing hosts behind fault proxies, kills at random and
# chosen moments, the demo's scenario (CHAOS_ORDERS orders at CHAOS_RATE messages a second, SEED); the
# table in results/chaos/chaos.{json,md}; exit 1 with the replay command if an invariant breaks.
CHAOS_ORDERS ?= 3500
CHAOS_RATE ?= 24
CHAOS_HOSTS ?= 4
chaos: setup
	$(BIN)/python -m chaos --orders $(CHAOS_ORDERS) --rate $(CHAOS_RATE) --hosts $(CHAOS_HOSTS) --seed $(SEED) \
		$(CHAOS_ARGS)

# What effectively-once costs, against the designs used instead, at the request floor (tools/bench/): every
# strategy, workload and concurrency in one run, cold start, memory; results/bench/bench.{md,json,png}.
bench: setup
	$(BIN)/python -m bench $(BENCH_ARGS)

# A local Cosmos DB NoSQL server on 127.0.0.1:8081 for workstation runs without the emulator.
cosmos-server: setup
	$(BIN)/python -m devservers.cosmos --port 8081

# Azurite (npm, tools/devservers/azurite) on 127.0.0.1:10000-10002, where UseDevelopmentStorage=true points; data
# in .azurite/. make run starts it too.
azurite: setup
	$(BIN)/python -m devservers.azurite

# The docs as a site in site/ (open site/index.html), built strictly as the test command builds it.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --site-dir site

# The local Service Bus broker (a test peer, see tools/devservers/servicebus/README.md) on 127.0.0.1:5672.
servicebus-server: setup
	$(BIN)/python -m devservers.servicebus --config infra/local/servicebus/Config.json --port 5672

# Checkov over infra/ on its own (the test command runs it too, in tests/infra/test_checkov.py).
checkov: setup
	$(CHECKOV_VENV)/bin/checkov -d infra --skip-download --compact

# The deterministic simulator of the core over SEEDS seeds; a failing seed prints its replay command.
SEEDS ?= 20000
PAYMENT_SEEDS ?= 2000
simulate: setup
	$(BIN)/python -m simulation --seeds $(SEEDS)

# The payments example (examples/payments) under the library's simulation kit: its own function_app.py first on the
# path, the library from the root.
simulate-payments: setup
	PYTHONPATH=. $(BIN)/python examples/payments/simulation.py --seeds $(PAYMENT_SEEDS)

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) $(DOCS_VENV) $(COSMOS_DIR)/node_modules $(AZURITE_DIR)/node_modules site .azurite \
		.pytest_cache .mypy_cache .ruff_cache .hypothesis
