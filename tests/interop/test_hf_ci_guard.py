"""Without the hf extra, the transformers parity tests skip on a laptop but fail in CI."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture
def no_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` raise ImportError


def test_missing_transformers_fails_in_ci(no_transformers, monkeypatch, request):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="hf extra"):
        request.getfixturevalue("transformers")


def test_missing_transformers_skips_locally(no_transformers, monkeypatch, request):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        request.getfixturevalue("transformers")
