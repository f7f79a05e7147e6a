#!/usr/bin/env bash
# Print the path of a Python 3.12 interpreter: lerobot 0.6 needs exactly 3.12.
# Looks on PATH first, then in pyenv; exits 1 with advice when none exists.
set -u
for cand in python3.12 python3 python; do
  p=$(command -v "$cand" 2>/dev/null) || continue
  if "$p" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 12) else 1)' 2>/dev/null; then
    echo "$p"; exit 0
  fi
done
if command -v pyenv >/dev/null 2>&1; then
  for v in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.12(\.[0-9]+)?$' | sort -V -r); do
    p=$(PYENV_VERSION="$v" pyenv which python 2>/dev/null) && { echo "$p"; exit 0; }
  done
fi
cat >&2 <<'MSG'
robot_rl needs Python 3.12 (lerobot 0.6 requires it) and none was found.
Install one, e.g.  `pyenv install 3.12`  or  `apt-get install python3.12 python3.12-venv`,
then rerun the make command.
MSG
exit 1
