#!/usr/bin/env bash
# Create a separate virtual environment holding TRL 1.16.0 and aiohttp, for
# tests/teacher_server/test_openai_trl.py: TRL's own VLLMClient.get_sequence_logprobs
# scoring against `miniverl teacher serve --openai`, and for
# tests/student/train/test_cross_vocab_trl.py (TRL's GOLD alignment and ULD losses).
#
#   bash tests/teacher_server/setup_trl_venv.sh       # venv at $MINIVERL_TRL_VENV
#   MINIVERL_TRL_VENV=/tmp/t bash tests/teacher_server/setup_trl_venv.sh
#
# --system-site-packages: torch, transformers and miniverl (editable) come from the
# system, so torch is not downloaded again. vLLM is not installed (TRL's client needs
# only requests to talk to a server; the test says how it gets past the client's vLLM
# import check). Idempotent: an existing venv with trl 1.16.0 importable is left alone.
set -euo pipefail

VENV="${MINIVERL_TRL_VENV:-${HOME}/.cache/miniverl/trl-1.16.0-venv}"
PY="${PYTHON:-python3}"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import trl, aiohttp, sys; sys.exit(trl.__version__ != '1.16.0')" 2>/dev/null; then
    echo "trl venv ready: $VENV"
    exit 0
fi

"$PY" -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "trl==1.16.0" "requests" "aiohttp>=3.14"
"$VENV/bin/python" -c "import trl; print('trl', trl.__version__, 'ready in', '$VENV')"
