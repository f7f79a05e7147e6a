#!/usr/bin/env bash
# One-time set-up behind `make demo` / `make test`: system libraries for headless
# rendering and video, a Python 3.12 virtualenv in .venv, and the package with its
# test extras. Safe to rerun; it only does what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages: EGL/Mesa for headless MuJoCo rendering, ffmpeg for LeRobot video, headless
# Chromium and its driver for the fleet console's browser test.
need_apt=()
ldconfig -p 2>/dev/null | grep -q 'libEGL.so.1' || need_apt+=(libegl1 libgl1 libgl1-mesa-dri libglx-mesa0)
ldconfig -p 2>/dev/null | grep -q 'libEGL_mesa' || need_apt+=(libegl-mesa0 libgl1-mesa-dri)
command -v ffmpeg >/dev/null 2>&1 || need_apt+=(ffmpeg)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
if [ ${#need_apt[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "[setup] installing system packages: ${need_apt[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "[setup] WARNING: missing system packages (${need_apt[*]}); install them with your package manager." >&2
  fi
fi

PY=$(scripts/find_python312.sh)
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $PY"
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check uv
echo "[setup] installing robot_rl and its dependencies (first time: a few minutes)"
# Bytecode is compiled once here: the tests start many processes that import torch and lerobot.
.venv/bin/uv pip install --python .venv/bin/python -q --compile-bytecode -e '.[dev]'
touch .venv/.installed
echo "[setup] done"
