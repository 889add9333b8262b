"""``miniverl convert-gguf``: a bad path is one line and exit 1; a cached conversion is reused.

The conversion itself is covered by tests/integration/test_real_model.py; here the
command must not convert anything (a pre-made cache entry stands in for it).
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from miniverl.cli.app import app
from miniverl.common.errors import ConfigError
from miniverl.common.gguf_import import CONVERTER_VERSION, RECORD_FILE
from miniverl.common.hashing import sha256_file

runner = CliRunner()


def test_convert_gguf_missing_file_is_one_line(tmp_path):
    # main() prints a MiniverlError as one line and exits 1; the command must raise one.
    result = runner.invoke(app, ["convert-gguf", str(tmp_path / "absent.gguf")])
    assert isinstance(result.exception, ConfigError)
    assert "does not exist" in str(result.exception) and "\n" not in str(result.exception)


def test_convert_gguf_returns_an_existing_conversion_without_work(tmp_path):
    # Users run the command once per machine and paste the printed path into recipes;
    # a second run must print the same directory at once.
    src = tmp_path / "m.gguf"
    src.write_bytes(b"GGUF not really")
    out = tmp_path / "m-hf"
    out.mkdir()
    (out / RECORD_FILE).write_text(
        json.dumps({"sha256": sha256_file(src), "converter": CONVERTER_VERSION})
    )
    result = runner.invoke(app, ["convert-gguf", str(src), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(out)
