"""The llama.cpp programs are found where build.sh builds them, else (llama.cpp's own tools) on PATH, and a
missing one names every way to provide it."""

from __future__ import annotations

import os

from tools.llamacpp.binaries import llamacpp_program, not_found, where_built


def test_an_install_on_path_serves_when_build_sh_built_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("GQA_LLAMACPP_CACHE", str(tmp_path / "empty-cache"))  # build.sh built nothing there
    installed = tmp_path / "bin" / "llama-bench"
    installed.parent.mkdir()
    installed.write_text("#!/bin/sh\n")
    installed.chmod(0o755)
    monkeypatch.setenv("PATH", f"{installed.parent}{os.pathsep}{os.environ['PATH']}")
    assert where_built("--where-bench").is_relative_to(tmp_path / "empty-cache")
    assert llamacpp_program("llama-bench") == installed
    # The probe is ours: only build.sh makes it, whatever PATH holds.
    (installed.parent / "probe").write_text("#!/bin/sh\n")
    assert llamacpp_program("probe") is None
    said = not_found("probe")
    assert "tools/llamacpp/build.sh" in said and "GQA_LLAMACPP_CACHE" in said and "PATH" not in said
    assert "put llama.cpp's llama-simple on PATH" in not_found("llama-simple")
