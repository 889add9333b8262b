#!/usr/bin/env bash
# Create a separate virtual environment holding one official verl release for the
# `verl`-marked bridge tests (tests/bridge/test_verl_real.py, test_verl_prompt_parity.py).
# Each supported release gets its own venv:
#
#   bash tests/bridge/setup_verl_venv.sh              # verl 0.8.0 (the default target)
#   bash tests/bridge/setup_verl_venv.sh 0.9.1        # verl 0.9.1
#   MINIVERL_VERL_VENVS=/tmp/venvs bash tests/bridge/setup_verl_venv.sh 0.9.1
#
# The venv is $MINIVERL_VERL_VENVS/verl-VERSION-venv (default ~/.cache/miniverl).
# verl goes in with --no-deps: its GPU stack (Ray, vLLM, SGLang, flash-attn) is neither
# needed nor installable here. Only what verl's config, dataset and reward-loading code
# import is added. torch comes from the system site-packages (--system-site-packages), so
# it is not downloaded a second time; pyarrow and datasets are pinned inside the venv
# because verl 0.8.0 needs older ones than ours, and for 0.9.1 transformers is pinned to
# the range verl 0.9.1 declares (>=5.5.3,<5.11,!=5.6.0; ours is newer). miniverl itself is
# visible through the system site-packages too (editable install).
# Idempotent: an existing venv with that verl importable is left alone.
set -euo pipefail

VERSION="${1:-0.8.0}"
case "$VERSION" in
    0.8.0) EXTRA=() ;;
    0.9.1) EXTRA=("transformers>=5.5.3,<5.11,!=5.6.0") ;;
    *) echo "error: verl $VERSION is not a supported target; use 0.8.0 or 0.9.1" >&2; exit 1 ;;
esac
VENV="${MINIVERL_VERL_VENVS:-${HOME}/.cache/miniverl}/verl-${VERSION}-venv"
PY="${PYTHON:-python3}"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import verl, fastapi, uvicorn, sys; sys.exit(verl.__version__ != '$VERSION')" 2>/dev/null; then
    echo "verl venv ready: $VENV"
    exit 0
fi

"$PY" -m venv --system-site-packages "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" --no-deps "verl==$VERSION"
# What verl's config (Hydra/OmegaConf), RLHFDataset and reward loader import, and the
# fastapi/uvicorn its agent loop's modules import at module level (the prompt-parity check;
# without them here they came only from another package of the system, e.g. trackio's).
"${PIP[@]}" "hydra-core" "omegaconf" "tensordict>=0.8.0,<=0.10.0,!=0.9.0" \
    "datasets<5.2" "pyarrow<24" "cachetools" "codetiming" "pillow" "dill" "pandas" \
    "fastapi" "uvicorn" ${EXTRA[@]+"${EXTRA[@]}"}
# verl/__init__.py imports verl.protocol, which imports Ray at module level (for
# `ray.ObjectRef` annotations and DataProtoFuture). The config, dataset and reward paths
# checked here never call Ray, so a stand-in module is installed that raises on any use:
# if a checked path ever touched Ray, the check fails instead of silently passing.
# The venv's transformers (its own for 0.9.1, the system's for 0.8.0) names the versions of
# huggingface-hub and kernels it imports with; the packages above may have pulled others
# (datasets an older hub, the system a newer kernels), and then `import verl` fails inside
# transformers. Read its table as a file: importing transformers would run the check.
read -r -a PINS <<< "$("$VENV/bin/python" - <<'PY'
import importlib.util, pathlib
table = pathlib.Path(importlib.util.find_spec("transformers").origin).parent / "dependency_versions_table.py"
scope = {}
exec(table.read_text(), scope)
print(" ".join(scope["deps"][name] for name in ("huggingface-hub", "kernels") if name in scope["deps"]))
PY
)"
"${PIP[@]}" "${PINS[@]}" "datasets<5.2"
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if ! "$VENV/bin/python" -c "import ray" 2>/dev/null; then
    mkdir -p "$SITE/ray"
    cat > "$SITE/ray/__init__.py" <<'PY'
"""Stand-in for Ray in miniverl's verl check venv: importable, unusable."""


class ObjectRef:
    """Placeholder so verl.protocol's annotations evaluate."""


def __getattr__(name):
    raise AttributeError(f"ray.{name}: Ray is not installed in the miniverl verl check venv")
PY
fi
"$VENV/bin/python" -c "import verl; print('verl', verl.__version__, 'ready in', '$VENV')"
