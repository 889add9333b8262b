"""TRL 1.16's own client scoring against a teacher's OpenAI endpoint; run with the TRL
venv's python (``tests/teacher_server/setup_trl_venv.sh``).

    ~/.cache/miniverl/trl-1.16.0-venv/bin/python tests/teacher_server/trl_client_check.py \
        BASE_URL REQUEST.json

``REQUEST.json`` is ``{"sequences", "prompt_lengths", "k", "temperature"}``. Builds
``trl.generation.vllm_client.VLLMClient(base_url=..., connection_timeout=60.0)`` as
``ServerDistillationTrainer`` does (its ``/health`` wait and ``/v1/models`` lookup
included) and prints ``get_sequence_logprobs``' result after a marker. One thing is
changed: the constructor's ``is_vllm_available()`` check, which refuses to build the
client unless vLLM is installed in the *client's* environment although the client talks
to the server with ``requests`` only; vLLM is not installed here, so the check is made to
pass. Nothing else of TRL is touched.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MARKER = "TRL_RESULT "


def main(base_url: str, request_path: str) -> int:
    import trl
    import trl.generation.vllm_client as vllm_client

    vllm_client.is_vllm_available = lambda: True
    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    client = vllm_client.VLLMClient(base_url=base_url, connection_timeout=60.0)
    out = client.get_sequence_logprobs(
        sequences=request["sequences"], prompt_lengths=request["prompt_lengths"],
        top_logprobs=request["k"], temperature=request["temperature"])
    print(MARKER + json.dumps({"trl_version": trl.__version__, "model": client.model, **out}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
