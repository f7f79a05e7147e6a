#!/usr/bin/env bash
# The type checker over the installed layout. setup.py installs hardware/, policies/, bridges/ and
# calibration/ as robot_rl.hardware, ... ; mypy cannot follow that mapping in the source tree, so
# it checks a tree of links laid out as the installed package, and reports the source paths.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=build/typecheck
rm -rf "$tree" && mkdir -p "$tree/robot_rl"
for entry in robot_rl/*; do ln -s "$PWD/$entry" "$tree/robot_rl/$(basename "$entry")"; done
for folder in hardware policies bridges calibration; do ln -s "$PWD/$folder" "$tree/robot_rl/$folder"; done
status=0
(cd "$tree" && "$OLDPWD/.venv/bin/mypy" --config-file "$OLDPWD/pyproject.toml" -p robot_rl) \
  | sed -E 's#^robot_rl/(hardware|policies|bridges|calibration)/#\1/#; t; s#^robot_rl/#robot_rl/#' || status=$?
exit $status
