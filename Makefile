# The README's two commands. Both do all set-up on a fresh machine.
.PHONY: demo test test-long lint setup clean

VENV_STAMP := .venv/.installed

$(VENV_STAMP): pyproject.toml setup.py scripts/setup_env.sh
	scripts/setup_env.sh

setup: $(VENV_STAMP)

demo: $(VENV_STAMP)
	.venv/bin/robot-rl run

# Lint and types first (seconds), then the suite: files whole on two workers, in the order
# tests/conftest.py sets (slow files first; xdist would otherwise start the files with most tests
# first and leave the one-test end-to-end files to run alone at the end); the 20 slowest tests listed.
test: lint
	.venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=20 tests

lint: $(VENV_STAMP)
	.venv/bin/ruff check robot_rl hardware policies bridges calibration tests setup.py
	scripts/typecheck.sh

# Minutes-long learning checks that `make test` leaves out (see tests/test_learning_e2e.py).
test-long: $(VENV_STAMP)
	.venv/bin/python -m pytest -q tests -m long

clean:
	rm -rf .venv outputs runs build .pytest_cache
