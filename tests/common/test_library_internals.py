"""The private parts of Lightning, jsonargparse and wandb are reached from common/library_internals.py alone, they
exist in the installed versions, and a version outside the tested range is named."""

from __future__ import annotations

import re
import subprocess
import warnings
from pathlib import Path

import lightning as L
import pytest

from common import library_internals
from common.library_internals import untested_versions, warn_untested_versions

ROOT = Path(__file__).resolve().parents[2]
FENCE = "common/library_internals.py"
# What a call into a private part looks like in our code: the fence's own names, matched outside it.
PRIVATE = re.compile(
    r"_signal_connector|_batches_that_stepped|_logger_connector|increment_progress_to_evaluation_end"
    r"|jsonargparse\._|wandb\.proto|wandb_internal_pb2"
)


def test_no_module_but_the_fence_touches_a_private_part() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    offenders = [
        f"{path}:{number}"
        for path in tracked.stdout.split()
        if path != FENCE and not path.startswith("tests/")
        for number, line in enumerate((ROOT / path).read_text().splitlines(), 1)
        if PRIVATE.search(line)
    ]
    assert offenders == []


def test_every_fenced_private_part_exists_in_the_installed_libraries() -> None:
    from jsonargparse._link_arguments import skip_apply_links  # noqa: F401
    from wandb.proto.wandb_internal_pb2 import Record

    assert {"history", "summary"} <= {
        field.name for field in Record.DESCRIPTOR.oneofs_by_name["record_type"].fields
    }
    trainer = L.Trainer(
        logger=False, enable_checkpointing=False, enable_progress_bar=False, accelerator="cpu"
    )
    assert trainer._signal_connector.received_sigterm is False
    library_internals.set_stop_requested(trainer, True)
    assert trainer.received_sigterm  # Lightning's public view of the flag the fence sets
    assert isinstance(trainer.fit_loop.epoch_loop._batches_that_stepped, int)
    assert isinstance(trainer._logger_connector._first_loop_iter, (bool, type(None)))
    val_loop = trainer.fit_loop.epoch_loop.val_loop
    assert callable(val_loop.increment_progress_to_evaluation_end) and callable(val_loop.run)
    library_internals.replace_due_validation(trainer, print)
    assert val_loop.increment_progress_to_evaluation_end is print
    library_internals.restore_due_validation(trainer)
    assert val_loop.increment_progress_to_evaluation_end is not print


def test_the_installed_fenced_libraries_are_the_tested_versions() -> None:
    assert untested_versions() == []


def test_a_library_outside_its_tested_range_is_named_in_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    real = metadata.version
    monkeypatch.setattr(
        library_internals,
        "untested_versions",
        lambda: untested_versions(lambda name: "2.99.0" if name == "lightning" else real(name)),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_untested_versions()
    assert len(caught) == 1
    message = str(caught[0].message)
    assert message.startswith("lightning 2.99.0 (tested: ") and "wandb" not in message.split(":")[0]
