"""The mutations that tests/mutation_check.py applies: each one exact snippet of one file, replaced by a bug,
and the tests that must then fail. When the code moves on, update the `old` text here (don't drop the entry)."""

from __future__ import annotations

from dataclasses import dataclass

GENERATE = "tests/generation/test_generate.py::test_greedy_output_with_cache_equals_no_cache"
PARITY = "tests/model/test_cache_parity.py"
ATTENTION = "tests/model/test_attention.py"
HF_LOGITS = "tests/interop/test_hf_parity.py::test_logits_match_transformers"


@dataclass(frozen=True)
class Mutation:
    """One deliberate bug: in `path`, the exact text `old` becomes `new`; `tests` must then fail."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = [
    # The five that once passed every test (issue 20), then the ones the low-level tests already caught.
    Mutation(
        "rope-ignores-cache-pos (generate.py)",
        "model/cache.py",
        "self.rope.tables(self.pos, t,",
        "self.rope.tables(0, t,",
        (GENERATE,),
    ),
    Mutation(
        "rope-ignores-cache-pos (greedy)",
        "model/cache.py",
        "self.rope.tables(self.pos, t,",
        "self.rope.tables(0, t,",
        (f"{PARITY}::test_greedy_generate_with_cache_equals_recompute",),
    ),
    Mutation(
        "rope-ignores-cache-pos (sampling)",
        "model/cache.py",
        "self.rope.tables(self.pos, t,",
        "self.rope.tables(0, t,",
        (f"{PARITY}::test_seeded_sampling_with_cache_equals_recompute",),
    ),
    Mutation(
        "eos-rows-not-padded",
        "generation/sampling.py",
        "tokens = tokens.masked_fill(before, self.first)",
        "tokens = tokens",
        (f"{PARITY}::test_eos_stops_one_row_mid_sequence_and_pads_it_while_the_other_goes_on",),
    ),
    Mutation(
        "sigterm-save-skipped",
        "checkpoints/save_on_stop.py",
        "if isinstance(exception, SIGTERMException)",
        "if False",
        ("tests/training/test_sigterm.py",),
    ),
    Mutation(
        "induction-on-probe-maps",
        "inspection/attention_stats.py",
        "induction_score(induction_maps,",
        "induction_score(maps,",
        (
            (
                "tests/inspection/test_attention_stats.py::"
                "test_head_statistics_induction_uses_the_models_maps_of_the_repeated_sequence"
            ),
        ),
    ),
    Mutation(
        "maps-path-skips-mlp",
        "model/gpt.py",
        "return x + self.dropout(self.mlp(",
        "return x if probs_out is not None else x + self.dropout(self.mlp(",
        (f"{ATTENTION}::test_attention_maps_are_the_models_own",),
    ),
    Mutation(
        "top-left-causal-mask",
        "model/attention.py",
        "tril(diagonal=s - t)",
        "tril(diagonal=0)",
        (f"{ATTENTION}::test_explicit_path_reproduces_sdpa",),
    ),
    Mutation(
        "is-causal-for-a-chunk",
        "model/attention.py",
        "attn_mask=mask, enable_gqa",
        "is_causal=True, enable_gqa",
        (f"{PARITY}::test_chunked_prefill_matches_full_forward",),
    ),
    Mutation(
        "tiled-gqa-mapping",
        "model/attention.py",
        "k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)",
        "k = k.repeat(1, q.shape[1] // k.shape[1], 1, 1)",
        (f"{ATTENTION}::test_explicit_path_reproduces_sdpa",),
    ),
    Mutation(
        "flash-no-online-rescale",
        "model/flash_reference.py",
        "acc = acc * rescale +",
        "acc = acc +",
        ("tests/model/test_flash_reference.py",),
    ),
    Mutation(
        "flash-tiles-top-left-diagonal",
        "model/flash_reference.py",
        "first_pos = s - t + q_start",
        "first_pos = q_start",
        ("tests/model/test_flash_reference.py",),
    ),
    Mutation(
        "every-rank-reads-shard-0",
        "data/batches.py",
        "self.shard_start = rank * shard_len",
        "self.shard_start = 0",
        ("tests/data/test_data_batches.py",),
    ),
    Mutation(
        "rolled-targets",
        "data/batches.py",
        "x, y = window[..., :-1], window[..., 1:]",
        "x, y = window[..., :-1], window[..., :-1].roll(-1, -1)",
        ("tests/data/test_data_batches.py",),
    ),
    Mutation(
        "stream-restarts-at-batch-0",
        "data/datamodule.py",
        "return trainer.global_step * trainer.accumulate_grad_batches if trainer is not None else 0",
        "return 0",
        ("tests/data/test_data_lightning_resume.py",),
    ),
    Mutation(
        "export-rms-norm-eps-10x-smaller",
        "interop/hf_folder.py",
        '"rms_norm_eps": config.norm_eps,',
        '"rms_norm_eps": config.norm_eps / 10,',
        (HF_LOGITS,),
    ),
    # Chosen for this check: properties the tests name that no entry above exercises.
    Mutation(
        "export-gate-up-swapped",
        "interop/names.py",
        'Part("model.layers.{i}.mlp.gate_proj.weight", "blk.{i}.ffn_gate.weight", "mlp"),\n'
        '        Part("model.layers.{i}.mlp.up_proj.weight", "blk.{i}.ffn_up.weight", "mlp"),',
        'Part("model.layers.{i}.mlp.up_proj.weight", "blk.{i}.ffn_gate.weight", "mlp"),\n'
        '        Part("model.layers.{i}.mlp.gate_proj.weight", "blk.{i}.ffn_up.weight", "mlp"),',
        (HF_LOGITS,),
    ),
    Mutation(
        "ddp-ranks-read-rank-0-batches",
        "data/datamodule.py",
        "self.train_batches(start_batch, rank, world_size)",
        "self.train_batches(start_batch, 0, world_size)",
        ("tests/training/test_ddp.py",),
    ),
    Mutation(
        "cache-writes-at-position-0",
        "model/cache.py",
        "keys.narrow(2, self.pos, k.shape[2]).copy_(k)",
        "keys.narrow(2, 0, k.shape[2]).copy_(k)",
        (f"{PARITY}::test_token_by_token_decode_matches_full_forward",),
    ),
    Mutation(
        "rope-rotate-half-sign",
        "model/attention.py",
        "torch.cat([-x[..., half:], x[..., :half]]",
        "torch.cat([x[..., half:], -x[..., :half]]",
        (HF_LOGITS,),
    ),
    Mutation(
        "top-p-drops-the-crossing-token",
        "generation/sampling.py",
        "drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= top_p",
        "drop_sorted = cumulative >= top_p",
        ("tests/generation/test_sampling.py::test_top_p_keeps_the_smallest_set_reaching_p",),
    ),
    Mutation(
        "repetition-penalty-inverted",
        "generation/sampling.py",
        "picked / penalty, picked * penalty",
        "picked * penalty, picked / penalty",
        ("tests/generation/test_sampling.py::test_repetition_penalty_lowers_seen_tokens_only",),
    ),
    Mutation(
        "nonfinite-loss-unchecked",
        "training/lit_gpt.py",
        "not torch.isfinite(loss).item()",
        "False",
        (
            (
                "tests/training/test_resume.py::"
                "test_nonfinite_loss_raise_stops_and_keeps_the_last_good_checkpoint"
            ),
        ),
    ),
    Mutation(
        "weight-decay-on-norms",
        "training/schedule.py",
        "if p.dim() >= 2]",
        "]",
        ("tests/training/test_optimizer_groups.py",),
    ),
]
