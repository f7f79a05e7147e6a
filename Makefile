# The README's two commands. Both do all set-up on a fresh machine.
.PHONY: demo test setup clean

VENV_STAMP := .venv/.installed

$(VENV_STAMP): pyproject.toml scripts/setup_env.sh
	scripts/setup_env.sh

setup: $(VENV_STAMP)

demo: $(VENV_STAMP)
	.venv/bin/robot-rl run

test: $(VENV_STAMP)
	.venv/bin/python -m pytest -q tests

clean:
	rm -rf .venv outputs runs .pytest_cache
