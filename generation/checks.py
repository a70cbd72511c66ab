"""What generate.py refuses in one line before it works: flag values and combinations that cannot work or would
do nothing, a prompt that is not UTF-8, and a batch whose cache cannot fit in the free memory."""

from __future__ import annotations

import argparse
import sys

import torch

from common.errors import UserError
from generation.sampling import Sampler
from generation.static_decode import cache_length
from model.cache import cache_bytes

from .text import not_utf8, utf8, utf8_lines

CHAT_CONFLICTS = ("prompt", "prompt_file", "draft", "prompt_lookup", "benchmark", "compile", "no_cache",
                  "attention_map", "attention_html", "explain_attention", "num_samples")  # fmt: skip
# --explain_attention prints its table and generates nothing.
EXPLAIN_CONFLICTS = ("prompt", "prompt_file", "no_echo", "max_new_tokens", "num_samples", "ignore_eos", "draft",
                     "prompt_lookup", "benchmark", "compile", "no_cache", "attention_map", "attention_html",
                     "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed")  # fmt: skip


def check_args(args: argparse.Namespace) -> Sampler:
    """One-line errors for flags that cannot work, before the checkpoint is loaded; the sampler they ask for."""
    try:
        sampler = Sampler(args.temperature, args.top_k, args.top_p, args.min_p, args.repetition_penalty)
    except UserError as err:  # the check names the field; here it is a flag
        raise UserError(f"--{err}") from None
    for flag in ("max_new_tokens", "num_samples", "draft_k"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if not -(2**63) <= args.seed < 2**64:  # the range torch's manual_seed takes
        raise UserError(f"--seed must be in [-2**63, 2**64 - 1] (a 64-bit integer), got {args.seed}")
    if args.draft and args.prompt_lookup:
        raise UserError("--draft and --prompt_lookup are two ways of drafting; pick one")
    if args.draft or args.prompt_lookup:
        if args.num_samples != 1 or args.no_cache or args.compile or args.repetition_penalty != 1.0:
            raise UserError("speculative decoding (--draft/--prompt_lookup) takes one sample from the cache: drop "
                            "--num_samples, --no_cache, --compile and --repetition_penalty")  # fmt: skip
    if args.keep_quantized and args.dequantize:
        raise UserError("--keep_quantized and --dequantize contradict each other: pass one")
    if args.compile and args.no_cache:
        raise UserError("--compile builds the step that decodes from the KV cache: drop --no_cache")
    for flag in ("prompt", "explain_attention"):
        if getattr(args, flag) is not None:
            utf8(getattr(args, flag), f"--{flag}")
    explain, drafting = args.explain_attention is not None, args.draft or args.prompt_lookup
    pointless = [  # (when, flags that then do nothing if given, why)
        (args.chat, CHAT_CONFLICTS, "--chat reads its turns from stdin and decodes one reply from the KV cache"),
        (explain, EXPLAIN_CONFLICTS, "--explain_attention prints one head's attention on its TEXT and generates nothing"),
        (args.benchmark, ("attention_map", "attention_html"), "--benchmark measures speed and writes no text or attention"),
        (args.prompt is not None, ("prompt_file",), "--prompt and --prompt_file are two prompts; pass one"),
        (not drafting, ("draft_k",), "--draft_k sets speculative decoding's tokens per round, and neither --draft nor --prompt_lookup was given"),
        (not (args.attention_map or explain), ("layer",), "--layer picks the layer of --attention_map or --explain_attention, and neither was given"),
        (not explain, ("head",), "--head picks the head of --explain_attention, which was not given"),
        (not (args.attention_map or args.attention_html), ("force",), "--force replaces an existing --attention_map or --attention_html file, and neither was given"),
    ]  # fmt: skip
    for when, flags, why in pointless:
        given = [f"--{flag}" for flag in flags if flag in args.explicit]  # a default never counts
        if when and given:
            raise UserError(f"{why}; drop {', '.join(given)}")
    return sampler


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt text; an empty one samples unconditionally (from the end-of-text token)."""
    if args.prompt is not None:
        return args.prompt
    if args.prompt_file is not None:
        try:
            with open(args.prompt_file, encoding="utf-8") as f:
                return f.read()
        except OSError as err:
            raise UserError(f"--prompt_file {args.prompt_file}: {err.strerror}") from None
        except UnicodeDecodeError as err:
            raise not_utf8(f"--prompt_file {args.prompt_file}", err) from None
    if not sys.stdin.isatty():
        return "".join(utf8_lines(sys.stdin, "the prompt on stdin"))
    raise UserError('no prompt: pass --prompt TEXT (or "" for none), --prompt_file FILE or pipe text in')


def free_memory(device: torch.device) -> int | None:
    """Bytes the device can still hand out: the GPU's free memory, Linux's MemAvailable; None where unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")), None)
    except OSError:  # not Linux
        return None


def refuse_a_batch_too_big(
    model: torch.nn.Module, num_samples: int, length: int, device: torch.device, compiled: bool
) -> None:
    """One line, before anything is allocated, when the batch's KV cache (the compiled step's, when `compiled`),
    token ids and float32 logits alone exceed the free memory: else the allocation fails later, or the kernel
    kills the process."""
    free = free_memory(device)
    if free is None:
        return
    config = model.config
    cache = cache_bytes(
        config, cache_length(config.block_size, length, compiled), next(model.parameters()).element_size()
    )
    need = num_samples * (cache + length * 8 + config.vocab_size * 4)
    if need > free:
        # One sample is as small as a batch gets: then only fewer new tokens help.
        flags = "--max_new_tokens" if num_samples == 1 else "--num_samples or --max_new_tokens"
        raise UserError(f"--num_samples {num_samples}: decoding {num_samples} x {length} tokens needs at least "
                        f"{need / 1e9:,.1f} GB (KV cache, token ids, logits), more than the {free / 1e9:,.1f} GB "
                        f"free on {device}; pass a smaller {flags}")  # fmt: skip
