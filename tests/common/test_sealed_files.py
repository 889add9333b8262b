"""Sealed files: a changed trajectory line or manifest is refused, old unsealed ones still read."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from miniverl.common.errors import ProvenanceError
from miniverl.common.hashing import seal, seal_status
from miniverl.common.manifest import (
    MANIFEST_VERSION,
    read_manifest,
    record_teacher,
    update_manifest,
    write_manifest,
)
from miniverl.common.trajectory import read_trajectories, write_trajectories
from tests.common.test_trajectory import make


def _trajectories(path: Path, n: int = 3) -> Path:
    write_trajectories(
        path, [make([("user", 2), ("assistant_final", 2)], tid=f"t{i}") for i in range(n)]
    )
    return path


def test_seal_covers_values_not_formatting():
    # Users reformat JSON (jq, editors); only a change of content must be refused.
    record = seal({"b": [1, 2.5, "x"], "a": {"k": None}})
    assert seal_status(record) == "ok"
    assert seal_status(json.loads(json.dumps(record, indent=4, sort_keys=True))) == "ok"
    assert seal_status({**record, "a": {"k": 0}}) == "mismatch"
    assert seal_status({"a": 1}) == "unsigned"


def test_every_written_line_is_sealed_and_reads_back(tmp_path):
    path = _trajectories(tmp_path / "trajectories.jsonl")
    for line in path.read_text().splitlines():
        assert seal_status(json.loads(line)) == "ok"
    assert [t.id for t in read_trajectories(path)] == ["t0", "t1", "t2"]


def test_a_changed_value_is_refused_with_file_and_line(tmp_path):
    # A flipped verifier verdict parses and validates; only the digest can catch it.
    path = _trajectories(tmp_path / "trajectories.jsonl")
    lines = path.read_text().splitlines()
    lines[1] = lines[1].replace('"success":false', '"success":true')
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ProvenanceError, match=rf"{path}:2: the line does not match its digest"):
        read_trajectories(path)


def test_bytes_that_are_not_utf8_are_a_provenance_error(tmp_path):
    path = _trajectories(tmp_path / "trajectories.jsonl")
    data = bytearray(path.read_bytes())
    data[10] = 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ProvenanceError, match=r":1: bytes that are not UTF-8"):
        read_trajectories(path)


def test_unsealed_lines_still_read_with_one_warning(tmp_path, caplog):
    # Files written before sealing stay readable; the user is told once per file.
    path = _trajectories(tmp_path / "trajectories.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "digest"}) + "\n"
                            for r in rows))
    with caplog.at_level(logging.WARNING):
        assert len(read_trajectories(path)) == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "3 line(s) carry no digest" in warnings[0]


def _run(tmp_path: Path) -> SimpleNamespace:
    run = SimpleNamespace(manifest_path=tmp_path / "manifest.json")
    write_manifest(run, {"manifest_version": MANIFEST_VERSION, "run_id": "r", "teachers": [],
                         "tokenizer_fp": None})
    return run


def test_manifest_is_resealed_on_every_write(tmp_path):
    # The manifest changes during a run (tokenizer, teacher ranges): each write reseals it.
    run = _run(tmp_path)
    update_manifest(run, tokenizer_fp="fp")
    record_teacher(run, 0, {"name": "t", "instance": "i", "gen": 0}, "connect")
    stored = json.loads(run.manifest_path.read_text())
    assert seal_status(stored) == "ok"
    manifest = read_manifest(run)
    assert "digest" not in manifest and manifest["tokenizer_fp"] == "fp"
    assert manifest["teachers"][0]["how"] == "connect"


def test_a_changed_manifest_is_refused(tmp_path):
    run = _run(tmp_path)
    text = run.manifest_path.read_text().replace('"run_id": "r"', '"run_id": "s"')
    run.manifest_path.write_text(text)
    with pytest.raises(ProvenanceError, match=r"manifest.json: the manifest does not match"):
        read_manifest(run)


def test_a_corrupted_manifest_is_a_provenance_error_not_a_traceback(tmp_path):
    run = _run(tmp_path)
    run.manifest_path.write_bytes(b"{\xff")
    with pytest.raises(ProvenanceError, match="not valid JSON"):
        read_manifest(run)


def test_an_unsealed_manifest_reads_with_a_warning(tmp_path, caplog):
    run = _run(tmp_path)
    old = {"manifest_version": 1, "run_id": "old"}
    run.manifest_path.write_text(json.dumps(old))
    with caplog.at_level(logging.WARNING):
        assert read_manifest(run) == old
    assert any("has no digest" in r.getMessage() for r in caplog.records)


def test_a_sealed_manifest_cannot_pass_as_an_old_one(tmp_path):
    # One flipped byte in the field's name ("digest" -> "digust") removes the digest;
    # a version-2 manifest must still be refused, not read as an unsealed old one.
    run = _run(tmp_path)
    text = run.manifest_path.read_text().replace('"digest"', '"digust"')
    run.manifest_path.write_text(text)
    with pytest.raises(ProvenanceError, match="does not match its digest"):
        read_manifest(run)
