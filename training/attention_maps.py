"""Log what every attention head looks at while the model trains: images, charts, a table and an explorer."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger

from checkpoints.run_dir import RunDir
from common.files import atomic_write
from inspection.attention_image import draw_attention_grid
from inspection.attention_stats import STATISTICS, Formation, PhaseChangeDetector
from inspection.explorer import build_explorer, probe_attention

from .callback_rules import due, evaluating, loggers_of

DEFAULT_PROBE = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak."


class AttentionMaps(L.Callback):
    """Every `every_n_steps` optimizer steps, on rank 0, draw and log the attention on a probe text: images,
    statistics, a table and the explorer (also `<run dir>/attention/explorer.html`), listed in docs/attention.md.

    Args:
        every_n_steps: Interval in optimizer steps; 0 disables the callback.
        probe_text: Text whose attention is drawn (cropped to the context length).
        layers: Layers to draw; null draws all of them (the statistics always cover every layer).
        heads: Heads to draw in each grid; null draws all of them.
        induction_period: Length of the random segment repeated to measure induction (<= block_size / 2).
        induction_threshold: Induction score above which a head counts as an induction head.
        explorer: Build the HTML explorer at each attention step.
    """

    def __init__(
        self,
        every_n_steps: int = 500,
        probe_text: str = DEFAULT_PROBE,
        layers: list[int] | None = None,
        heads: list[int] | None = None,
        induction_period: int = 32,
        induction_threshold: float = 0.5,
        explorer: bool = True,
    ) -> None:
        self.every_n_steps, self.probe_text = every_n_steps, probe_text
        self.layers, self.heads, self.induction_period = layers, heads, induction_period
        self.explorer = explorer
        self.detector = PhaseChangeDetector(induction_threshold)
        self.history: list[tuple[int, dict[str, torch.Tensor]]] = []  # (step, statistics) for the explorer

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not due(trainer, pl_module, self.every_n_steps):
            return
        step, model, tokenizer = trainer.global_step, pl_module.model, trainer.datamodule.tokenizer
        ids = tokenizer.encode(self.probe_text)[: model.config.block_size]
        probe = torch.tensor([ids], device=pl_module.device)
        with evaluating(pl_module):
            # The same random probe every time: comparable scores.
            generator = torch.Generator().manual_seed(0)
            maps, stats = probe_attention(model, probe, self.induction_period, generator=generator)
        if not trainer.is_global_zero:  # a sharded model computed the maps on every rank; rank 0 logs them
            return
        labels = [tokenizer.decode([i]) for i in ids]
        stats = {k: v.cpu() for k, v in stats.items()}
        self.history.append((step, stats))
        formations = self.detector.update(step, stats["induction"])
        for formation in formations:
            print(formation.message(), flush=True)
        page = None
        if self.explorer:
            page = build_explorer(
                maps[:, 0], labels, stats, title=f"attention at step {step}", step=step,
                history=self.history, formations=self.detector.formations, threshold=self.detector.threshold,
            )  # fmt: skip
            atomic_write(RunDir(trainer.default_root_dir).attention / "explorer.html", page)
        for logger in loggers_of(trainer, WandbLogger):  # images, tables, charts and pages are wandb features
            self._log(logger, step, maps, labels, stats, formations, page)

    def state_dict(self) -> dict[str, Any]:
        """The statistics history and the formed heads, so a resumed run neither forgets nor repeats them."""
        return {
            "history": [(step, {k: v.tolist() for k, v in stats.items()}) for step, stats in self.history],
            "formed": [vars(f) for f in self.detector.formations],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [
            (step, {k: torch.tensor(v) for k, v in s.items()}) for step, s in state_dict["history"]
        ]
        self.detector.formed = {(f["layer"], f["head"]): Formation(**f) for f in state_dict["formed"]}

    def _log(
        self, logger, step, maps, labels, stats: dict, formations: list[Formation], page: str | None
    ) -> None:
        import wandb  # only here: the callback works without wandb when no WandbLogger is used

        for formation in formations:
            logger.experiment.summary[f"attention/induction_formed/{formation.name}"] = formation.step
        n_layer, n_head = stats["entropy"].shape
        heads = [(layer, head) for layer in range(n_layer) for head in range(n_head)]
        # One chart per statistic with a line per head: one scalar per head and statistic made 576 for 12x12.
        charts = {
            f"attention/{name}": wandb.plot.line_series(
                xs=[s for s, _ in self.history],
                ys=[[float(s[name][layer, head]) for _, s in self.history] for layer, head in heads],
                keys=[f"L{layer}H{head}" for layer, head in heads],
                title=f"attention {name}",
                xname="step",
            )
            for name in STATISTICS
        }
        logger.log_metrics(charts, step=step)
        for layer in self.layers if self.layers is not None else range(n_layer):
            image = draw_attention_grid(maps[layer, 0], labels, f"layer {layer}, step {step}", self.heads)
            logger.log_image(key=f"attention/layer_{layer}", images=[image], step=step)
        rows = [
            [step, layer, head, *(round(float(stats[n][layer, head]), 4) for n in STATISTICS)]
            for layer, head in heads
        ]
        rows.sort(key=lambda row: -row[-1])
        logger.log_table(
            key="attention/heads", columns=["step", "layer", "head", *STATISTICS], data=rows, step=step
        )
        if page is not None:  # inject=False: wandb would otherwise add a stylesheet link, a network request
            logger.log_metrics({"attention/explorer": wandb.Html(page, inject=False)}, step=step)
