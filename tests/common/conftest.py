"""Fixtures for the common/ tests: ``records``, the qualification records the gate reads."""

from __future__ import annotations

import pytest

from miniverl.common import qualification


@pytest.fixture
def records(tmp_path, monkeypatch):
    """An empty folder that ``qualification`` reads and writes its records in, for this test."""
    folder = tmp_path / "qualifications"
    folder.mkdir()
    monkeypatch.setattr(qualification, "qualifications_dir", lambda: folder)
    return folder
