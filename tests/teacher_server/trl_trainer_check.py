"""TRL 1.16's ``ServerDistillationTrainer`` training a student against a teacher's OpenAI
endpoint; run with the TRL venv's python (``tests/teacher_server/setup_trl_venv.sh``).

    ~/.cache/miniverl/trl-1.16.0-venv/bin/python tests/teacher_server/trl_trainer_check.py \
        BASE_URL STUDENT_DIR OUT_DIR

On-policy distillation as TRL runs it: the student generates completions of a few plain
prompts with ``transformers`` (no vLLM for the student), the trainer asks the teacher at
``teacher_model_server_url`` for the top-k prompt log-probs of prompt + completion
through ``VLLMClient.get_sequence_logprobs`` and takes optimizer steps on the top-k
forward KL with the tail bucket (``beta: 0``, ``loss_top_k: 4``, ``loss_add_tail``).
Prints the trainer's log history after a marker. One thing is changed, as in
``trl_client_check.py``: the ``VLLMClient`` constructor's ``is_vllm_available()`` check,
which refuses to build the client unless vLLM is installed in the *client's*
environment although the client talks to the server with ``requests`` only.
"""

from __future__ import annotations

import json
import sys

MARKER = "TRL_TRAINER "
STEPS = 2


def main(base_url: str, student_dir: str, out_dir: str) -> int:
    import torch
    import trl
    import trl.generation.vllm_client as vllm_client
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.server_distillation import (
        ServerDistillationConfig,
        ServerDistillationTrainer,
    )

    vllm_client.is_vllm_available = lambda: True
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(student_dir, dtype=torch.float32)
    prompts = ["2 + 3 =", "What is 7 * 6?", "Call the calculator:", "12 - 5 is"]
    args = ServerDistillationConfig(
        output_dir=out_dir, teacher_model_server_url=base_url, beta=0.0, loss_top_k=4,
        loss_add_tail=True, temperature=1.0, max_completion_length=8,
        per_device_train_batch_size=2, max_steps=STEPS, learning_rate=1e-3,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0,
        dataloader_num_workers=0)
    trainer = ServerDistillationTrainer(
        model=model, args=args, train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer)
    trainer.train()
    print(MARKER + json.dumps({"trl_version": trl.__version__,
                               "global_step": trainer.state.global_step,
                               "log_history": trainer.state.log_history}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
