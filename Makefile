# The README's two commands. Both do all set-up on a fresh machine.
.PHONY: demo test test-long setup clean

VENV_STAMP := .venv/.installed

$(VENV_STAMP): pyproject.toml scripts/setup_env.sh
	scripts/setup_env.sh

setup: $(VENV_STAMP)

demo: $(VENV_STAMP)
	.venv/bin/robot-rl run

test: $(VENV_STAMP)
	.venv/bin/python -m pytest -q tests

# Minutes-long learning checks that `make test` leaves out (see tests/test_learning_e2e.py).
test-long: $(VENV_STAMP)
	.venv/bin/python -m pytest -q tests -m long

clean:
	rm -rf .venv outputs runs .pytest_cache
