"""DataLoader workers survive a Ctrl-C or SIGTERM sent to the whole job, so the trainer can stop at a step boundary."""

from __future__ import annotations

import os
import signal
import time

import pytest

from data.datamodule import TextDataModule


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("loader", ["train", "val"])
def test_a_worker_keeps_serving_batches_after_a_stop_signal(corpus, data_cache, loader, stop):
    data = TextDataModule(data_files=str(corpus), cache_dir=str(data_cache), vocab_size=384, block_size=32,
                          batch_size=8, num_workers=1)  # fmt: skip
    data.setup("fit")
    batches = iter(data.train_dataloader() if loader == "train" else data.val_dataloader())
    next(batches)
    (worker,) = batches._workers  # the worker process, alive once the first batch arrived
    os.kill(
        worker.pid, stop
    )  # what a terminal's Ctrl-C, or SLURM's SIGTERM, does to every process of the job
    time.sleep(1.0)
    assert worker.is_alive()
    assert next(batches)[0].shape[-1] == 32
    del batches
