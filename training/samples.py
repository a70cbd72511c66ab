"""A wandb table of sample generations from fixed prompts, so progress can be read, not only plotted."""

from __future__ import annotations

import hashlib
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger

from generation.sampling import Sampler, generate

from .callback_rules import due, evaluating, loggers_of


class SampleGenerations(L.Callback):
    """Every `every_n_steps` optimizer steps, on rank 0, continue each prompt and log a table (kept across resumes).

    Args:
        every_n_steps: Interval in optimizer steps; 0 disables the callback.
        prompts: Fixed prompts, continued at every interval so the rows compare across steps.
        max_new_tokens: Tokens generated per prompt.
        temperature: Sampling temperature (0 is greedy).
        top_k: Keep only the k most likely tokens when sampling.
        seed: Base seed of the sampling: each (step, prompt) pair samples with its own seed derived from it, so
            the prompts do not share one random stream (and converge) and a rerun gives the same table.
    """

    def __init__(
        self,
        every_n_steps: int = 500,
        prompts: list[str] | None = None,
        max_new_tokens: int = 64,
        temperature: float = 0.8,
        top_k: int | None = 50,
        seed: int = 0,
    ) -> None:
        self.every_n_steps = every_n_steps
        self.prompts = prompts if prompts is not None else ["\n", "ROMEO:", "The king"]
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.top_k, self.seed = top_k, seed
        self.rows: list[list] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not due(trainer, pl_module, self.every_n_steps):
            return
        step, tokenizer = trainer.global_step, trainer.datamodule.tokenizer
        with evaluating(pl_module):
            self.rows += [
                [step, prompt, self._continue(pl_module, tokenizer, prompt, self.sample_seed(step, index))]
                for index, prompt in enumerate(self.prompts)
            ]
        for logger in loggers_of(trainer, WandbLogger):  # tables are a wandb feature
            logger.log_text(
                key="samples", columns=["step", "prompt", "continuation"], data=self.rows, step=step
            )

    def sample_seed(self, step: int, prompt_index: int) -> int:
        """The seed of one table cell: a hash of (seed, step, prompt index), the same on every run."""
        digest = hashlib.sha256(f"{self.seed}/{step}/{prompt_index}".encode()).digest()
        return int.from_bytes(digest[:8], "little") >> 1  # manual_seed takes a non-negative 64-bit int

    def state_dict(self) -> dict[str, Any]:
        return {"rows": [list(row) for row in self.rows]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rows = [list(row) for row in state_dict.get("rows", [])]

    def _continue(self, pl_module, tokenizer, prompt: str, seed: int) -> str:
        ids = torch.tensor([tokenizer.prompt_ids(prompt)], device=pl_module.device)
        generator = torch.Generator(device=pl_module.device).manual_seed(seed)
        out = generate(
            pl_module.model, ids, self.max_new_tokens, sampler=Sampler(temperature=self.temperature, top_k=self.top_k, generator=generator),
            eos_id=tokenizer.eos_ids,
        )  # fmt: skip
        return tokenizer.decode(tokenizer.until_stop(out[0, ids.shape[1] :].tolist()))
