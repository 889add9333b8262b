#!/usr/bin/env bash
# Create a virtual environment holding the lowest supported versions of the training
# stack (tests/compat/lowest.txt, the lower bounds of pyproject.toml) for
# tests/compat/test_lowest_versions.py, which runs the fast tier of the suite in it.
#
#   bash tests/compat/setup_lowest_venv.sh          # venv at $MINIVERL_LOWEST_VENV
#   MINIVERL_LOWEST_VENV=/tmp/low bash tests/compat/setup_lowest_venv.sh
#
# --system-site-packages: the CPU torch wheel, the test tools and miniverl itself
# (editable install) come from the system; the pinned packages are installed inside the
# venv and shadow the system's newer ones. Idempotent: reinstalls only what differs.
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV="${MINIVERL_LOWEST_VENV:-${HOME}/.cache/miniverl/lowest-venv}"
PY="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r tests/compat/lowest.txt
echo "lowest-versions venv ready: $VENV"
