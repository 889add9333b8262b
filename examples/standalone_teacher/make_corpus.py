"""Write the standalone teacher's corpus: token ids of verified oracle episodes.

    python examples/standalone_teacher/make_corpus.py tokens.npy [--episodes 64]

The bigram teacher (``teacher.py``) counts its table from a ``.npy`` of int token ids.
This script plays the calculator environment's oracle (the tool call and final answer
that solve each task) on ``--episodes`` training tasks of ``recipe.yaml``'s environment,
renders each episode with the toy tokenizer the toy student uses, and saves the
episodes' token ids back to back (int32). It then prints the two values the teacher is
started with: the toy tokenizer's fingerprint and its vocabulary size.

Unlike ``teacher.py`` this script imports miniverl: the corpus must be in the student's
tokens, and miniverl is what renders them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from miniverl.common.tokenizer_id import fingerprint_tokenizer
from miniverl.common.toy import build_toy_tokenizer
from miniverl.student.environments import make_tasks
from miniverl.student.rollout.oracle import oracle_trajectories

# recipe.yaml's environment: the tasks the student will play, in the tokens it will see.
ENVIRONMENT = "calculator"
DIFFICULTY = "easy"
PARAMS = {"units": False}
SPLIT_SEED = 0


def write_corpus(out: Path, episodes: int) -> tuple[int, str, int]:
    """Save ``episodes`` oracle episodes' token ids to ``out``; (ids, fingerprint, vocab)."""
    tokenizer = build_toy_tokenizer()
    fp = fingerprint_tokenizer(tokenizer)
    tasks = make_tasks(ENVIRONMENT, "train", episodes, DIFFICULTY, SPLIT_SEED, PARAMS)
    trajectories = oracle_trajectories(ENVIRONMENT, tasks, tokenizer, fp, PARAMS)
    ids = np.concatenate([np.asarray(t.tokens, dtype=np.int32) for t in trajectories])
    np.save(out, ids, allow_pickle=False)
    return int(ids.size), fp, len(tokenizer)


def episode_count(text: str) -> int:
    """``--episodes``: a whole number from 1 to 100000."""
    if not text.isdigit() or not 1 <= int(text) <= 100_000:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1 to 100000")
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="The .npy file to write (e.g. tokens.npy).")
    parser.add_argument(
        "--episodes",
        type=episode_count,
        default=64,
        metavar="N",
        help="Oracle episodes to render (1-100000, default 64).",
    )
    args = parser.parse_args()
    n_ids, fp, vocab = write_corpus(args.out, args.episodes)
    print(
        f"wrote {args.out}: {n_ids} token ids from {args.episodes} oracle episodes "
        f"({ENVIRONMENT}, {DIFFICULTY})"
    )
    print(f"--tokenizer-fp {fp} --vocab-size {vocab}")


if __name__ == "__main__":
    main()
