"""A callback for the SIGTERM test: print a cue at a chosen step, then hold training there until SIGTERM.

Holding the step makes the test deterministic: the signal lands at a known step boundary, however fast or slow
the machine is, and no periodic checkpoint exists yet to hide a missing SIGTERM save.
"""

from __future__ import annotations

import time

import lightning as L

CUE = "paused at step"


class PauseAtStep(L.Callback):
    def __init__(self, step: int, timeout_s: float = 120.0) -> None:
        self.step = step
        self.timeout_s = timeout_s

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step != self.step:
            return
        print(f"{CUE} {trainer.global_step}", flush=True)
        # Lightning checks the SIGTERM flag right after this hook, so the stop lands exactly at this step.
        deadline = time.monotonic() + self.timeout_s
        while not trainer.received_sigterm and time.monotonic() < deadline:
            time.sleep(0.05)


class PauseInValidation(L.Callback):
    """Print the cue inside the validation that follows `step` (before its batch 1, so the validation is only
    half done), then hold there until SIGTERM, as PauseAtStep does at a step boundary."""

    def __init__(self, step: int, timeout_s: float = 120.0) -> None:
        self.step = step
        self.timeout_s = timeout_s

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if trainer.sanity_checking or trainer.global_step != self.step or batch_idx != 1:
            return
        print(f"{CUE} {trainer.global_step} (validating)", flush=True)
        deadline = time.monotonic() + self.timeout_s
        while not trainer.received_sigterm and time.monotonic() < deadline:
            time.sleep(0.05)


class PauseInSave(L.Callback):
    """Print the cue while the checkpoint of `step` is being put together (after the other callbacks have added
    their parts, before it is written), then hold the save there until SIGTERM."""

    def __init__(self, step: int, timeout_s: float = 120.0) -> None:
        self.step = step
        self.timeout_s = timeout_s

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if trainer.global_step != self.step or trainer.received_sigterm:
            return
        print(f"{CUE} {trainer.global_step} (saving)", flush=True)
        deadline = time.monotonic() + self.timeout_s
        while not trainer.received_sigterm and time.monotonic() < deadline:
            time.sleep(0.05)
