"""Sample text from a trained checkpoint, decoding incrementally from a KV cache.

    python generate.py --checkpoint runs/shakespeare --prompt "ROMEO:" --max_new_tokens 200

Imports only `model` and the tokenizer (no Lightning, no wandb), so it starts fast. User mistakes print one
line and exit with status 2 (see common/errors.py for every exit code); set GQA_GPT_TRACEBACK=1 for the full
traceback.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from common.errors import UserError, run_command
from data.tokenizer import Tokenizer
from model import KVCache, generate
from model.checkpoint import load_checkpoint
from model.config import DTYPES
from model.sampling import check_sampling_args
from model.speculative import DraftModel, PromptLookup, Sampler, check_draft, speculative_generate

BENCHMARK_REPEATS = 5


class _HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: X)" where there is a default to show (not for switches and unset options)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.required:
            return action.help
        return super()._get_help_string(action)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=_HelpWithDefaults)
    p.add_argument(
        "--checkpoint", required=True, help="a .ckpt file or a run directory (uses checkpoints/last.ckpt)"
    )
    p.add_argument("--prompt", help="text to continue; without it --prompt_file or standard input is read")
    p.add_argument("--prompt_file", help="read the prompt from this UTF-8 file")
    p.add_argument(
        "--no_echo", action="store_true", help="print only the continuation, not the prompt before it"
    )
    p.add_argument("--max_new_tokens", type=int, default=200, help="tokens to generate per sample")
    p.add_argument(
        "--ignore_eos",
        action="store_true",
        help="keep generating past the end-of-text token (benchmarks, stress tests)",
    )
    p.add_argument("--temperature", type=float, default=0.8, help="0 is greedy; higher is more random")
    p.add_argument("--top_k", type=int, default=None, help="sample only among the k most likely tokens")
    p.add_argument(
        "--top_p", type=float, default=None, help="sample from the smallest set with this much probability"
    )
    p.add_argument(
        "--min_p", type=float, default=None, help="drop tokens below this fraction of the best one"
    )
    p.add_argument("--repetition_penalty", type=float, default=1.0, help="> 1 discourages repeating tokens")
    p.add_argument("--seed", type=int, default=1337, help="seed of the sampling generator")
    p.add_argument("--num_samples", type=int, default=1, help="continuations, decoded together as one batch")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, mps or auto")
    p.add_argument(
        "--dtype", choices=[*DTYPES, "auto"], default="auto", help="auto: bfloat16 on CUDA, else float32"
    )
    p.add_argument(
        "--no_cache", action="store_true", help="recompute the whole context every step (reference path)"
    )
    p.add_argument("--benchmark", action="store_true", help="print prefill/decode speed and KV-cache size")
    p.add_argument(
        "--compile", action="store_true", help="decode with the compiled static-shape step (same tokens)"
    )
    p.add_argument(
        "--draft", metavar="CKPT", help="speculative decoding: a smaller checkpoint with the same tokenizer"
    )
    p.add_argument(
        "--prompt_lookup", action="store_true", help="speculative decoding, drafting by n-gram copy"
    )
    p.add_argument("--draft_k", type=int, default=4, help="tokens drafted per target forward (speculative)")
    p.add_argument(
        "--attention_map", metavar="PNG", help="draw the attention of --layer over prompt + output"
    )
    p.add_argument(
        "--attention_html", metavar="HTML", help="write an interactive attention explorer of prompt + output"
    )
    p.add_argument(
        "--explain_attention", metavar="TEXT", help="print scores, mask and softmax of --layer/--head"
    )
    p.add_argument(
        "--layer", type=int, default=None, help="layer for --attention_map (default last) or explain (0)"
    )
    p.add_argument("--head", type=int, default=0, help="head for --explain_attention")
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    """One-line errors for values the sampler would reject later, before the checkpoint is loaded."""
    check_sampling_args(
        args.max_new_tokens,
        args.temperature,
        args.top_k,
        args.top_p,
        args.min_p,
        args.repetition_penalty,
        prefix="--",
    )
    if args.num_samples < 1:
        raise UserError(f"--num_samples must be at least 1, got {args.num_samples}")
    if args.draft and args.prompt_lookup:
        raise UserError("--draft and --prompt_lookup are two ways of drafting; pick one")
    if args.draft or args.prompt_lookup:
        if args.num_samples != 1 or args.no_cache or args.compile or args.repetition_penalty != 1.0:
            raise UserError(
                "speculative decoding (--draft/--prompt_lookup) takes one sample from the cache: drop --num_samples, "
                "--no_cache, --compile and --repetition_penalty"
            )
        if args.draft_k < 1:
            raise UserError(f"--draft_k must be at least 1, got {args.draft_k}")
    if args.compile and args.no_cache:
        raise UserError("--compile decodes from the KV cache; drop --no_cache")


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        prompt = args.prompt
    elif args.prompt_file is not None:
        try:
            with open(args.prompt_file, encoding="utf-8") as f:
                prompt = f.read()
        except OSError as err:
            raise UserError(f"--prompt_file {args.prompt_file}: {err.strerror}") from None
    elif not sys.stdin.isatty():
        prompt = sys.stdin.read()
    else:
        raise UserError("no prompt: pass --prompt TEXT, --prompt_file FILE or pipe text on standard input")
    if not prompt:
        raise UserError("the prompt is empty; pass some text to continue")
    return prompt


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class TextStream:
    """Prints decoded text as tokens arrive; holds back a trailing partial UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer, self.ids, self.printed = tokenizer, [], 0

    def __call__(self, token: torch.Tensor) -> None:
        if int(token[0]) == self.tokenizer.eos_id:  # the stop token ends the text, as in the batch path
            return
        self.ids.append(int(token[0]))
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # a multi-byte character split across tokens: wait for the rest
            return
        print(text[self.printed :], end="", flush=True)
        self.printed = len(text)


def encode_prompt(tokenizer: Tokenizer, prompt: str, block_size: int, device: torch.device) -> torch.Tensor:
    ids = tokenizer.encode(prompt)
    if set(ids) <= unfamiliar_byte_ids(tokenizer):
        print("note: the prompt is made only of bytes the tokenizer never merged (rare or unseen in training, "
              "e.g. emoji); the model knows little about them, so expect output unrelated to the prompt",
              file=sys.stderr)  # fmt: skip
    if len(ids) > block_size:
        print(
            f"note: the prompt has {len(ids)} tokens; the model sees only the last {block_size}",
            file=sys.stderr,
        )
    return torch.tensor([ids], device=device)


def unfamiliar_byte_ids(tokenizer: Tokenizer) -> set[int]:
    """Ids of non-ASCII single-byte tokens that are part of no longer token.

    BPE merges every byte that is frequent in its training text, so a byte left unmerged was rare or absent
    there (the tokenizer holds all 256 bytes regardless). ASCII is excluded: a small vocabulary leaves even
    common letters unmerged.
    """
    table = tokenizer.token_bytes()
    merged = {byte for token in table if len(token) > 1 for byte in token}
    return {
        i for i, token in enumerate(table) if len(token) == 1 and token[0] >= 0x80 and token[0] not in merged
    }


def run(args: argparse.Namespace) -> None:
    check_args(args)
    device = pick_device(args.device)
    dtype = (
        DTYPES[args.dtype]
        if args.dtype != "auto"
        else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    )
    loaded = load_checkpoint(args.checkpoint)
    model = loaded.model.to(device=device, dtype=dtype)
    tokenizer = Tokenizer.from_json(loaded.tokenizer_json)
    if args.explain_attention is not None:
        return explain(model, tokenizer, args.explain_attention, args.layer or 0, args.head, device)
    prompt_text = read_prompt(args)
    prompt = encode_prompt(tokenizer, prompt_text, model.config.block_size, device)
    sample = dict(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty, eos_id=None if args.ignore_eos else tokenizer.eos_id,
    )  # fmt: skip
    echo = "" if args.no_echo else prompt_text
    if args.draft or args.prompt_lookup:
        return run_speculative(model, loaded, tokenizer, prompt, args, sample, echo)
    if args.benchmark:
        return benchmark(model, prompt.expand(args.num_samples, -1), args, sample)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    stream = TextStream(tokenizer) if args.num_samples == 1 else None
    try:
        if stream is not None:
            print(echo, end="", flush=True)
        out = generate(
            model, prompt.expand(args.num_samples, -1).contiguous(), args.max_new_tokens, generator=generator,
            use_cache=not args.no_cache, on_token=stream, compile=args.compile, **sample,
        )  # fmt: skip
    except KeyboardInterrupt:
        if stream is not None:
            print(flush=True)  # end the streamed line, so the "interrupted" message starts on its own
        raise
    new = out[:, prompt.shape[1] :]
    if stream is None:
        for i, row in enumerate(new.tolist()):
            print(f"--- sample {i + 1} ---\n{echo}{tokenizer.decode(_until_eos(row, tokenizer.eos_id))}")
    else:
        print()
    if args.attention_map:
        write_attention_map(model, tokenizer, out[:1], args.attention_map, args.layer)
    if args.attention_html:
        write_attention_html(model, tokenizer, out[:1], args.attention_html)


def load_drafter(args: argparse.Namespace, loaded, device: torch.device, dtype: torch.dtype):
    """A function making a fresh drafter of the kind the flags ask for (the draft checkpoint is read once here).

    A draft checkpoint must share the target's tokenizer and vocabulary.
    """
    if args.prompt_lookup:
        return PromptLookup
    draft = load_checkpoint(args.draft)
    check_draft(loaded.model, draft.model, loaded.meta["tokenizer_sha256"], draft.meta["tokenizer_sha256"])
    draft_model = draft.model.to(device=device, dtype=dtype)
    return lambda: DraftModel(draft_model, device, dtype)


def run_speculative(
    model, loaded, tokenizer: Tokenizer, prompt: torch.Tensor, args, sample: dict, echo: str
) -> None:
    """Speculative decoding; prints the acceptance rate, and with --benchmark the speed-up over plain decoding."""
    eos_id = None if args.benchmark else sample["eos_id"]  # a benchmark decodes the same count on both sides
    sample = {key: sample[key] for key in ("temperature", "top_k", "top_p", "min_p")}
    make_drafter = load_drafter(args, loaded, prompt.device, next(model.parameters()).dtype)

    def speculative(on_token=None):
        sampler = Sampler(generator=torch.Generator(device=prompt.device).manual_seed(args.seed), **sample)
        return speculative_generate(
            model,
            prompt,
            args.max_new_tokens,
            make_drafter(),
            k=args.draft_k,
            sampler=sampler,
            eos_id=eos_id,
            on_token=on_token,
        )

    if not args.benchmark:
        stream = TextStream(tokenizer)
        print(echo, end="", flush=True)
        start = time.perf_counter()
        out, stats = speculative(stream)
        seconds = time.perf_counter() - start
        print()
        print(
            f"[{stats.new_tokens} tokens, {stats.target_forwards} target forwards, acceptance "
            f"{stats.acceptance:.0%}, {stats.new_tokens / seconds:.1f} tokens/s]",
            file=sys.stderr,
        )
        return
    speculative()  # warm-up
    generate(model, prompt, 4, temperature=0.0)

    def plain_generate():
        generator = torch.Generator(device=prompt.device).manual_seed(args.seed)
        return generate(model, prompt, args.max_new_tokens, generator=generator, **sample)

    # A short decode is over in well under a second, where machine noise is large: alternate the two sides
    # and take medians.
    spec_times, plain_times = [], []
    for _ in range(BENCHMARK_REPEATS):
        start = time.perf_counter()
        out, stats = speculative()
        spec_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        plain = plain_generate()
        plain_times.append(time.perf_counter() - start)
    spec_s, plain_s = statistics.median(spec_times), statistics.median(plain_times)
    print(
        f"speculative: {stats.new_tokens / spec_s:.1f} tokens/s, acceptance {stats.acceptance:.0%} "
        f"({stats.accepted}/{stats.drafted}), {stats.target_forwards} target forwards"
    )
    print(f"plain:       {args.max_new_tokens / plain_s:.1f} tokens/s")
    print(
        f"speed-up:    {plain_s / spec_s * stats.new_tokens / args.max_new_tokens:.2f}x, "
        f"same tokens: {torch.equal(out, plain)} (medians of {BENCHMARK_REPEATS} alternating runs)"
    )


def _until_eos(ids: list[int], eos_id: int) -> list[int]:
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


def benchmark(model, prompt: torch.Tensor, args: argparse.Namespace, sample: dict) -> None:
    """Prefill and decode throughput, measured apart: the first token's arrival ends the prefill."""
    dtype = next(model.parameters()).dtype
    cache = KVCache.allocate(
        model.config, prompt.shape[0], model.config.block_size, device=prompt.device, dtype=dtype
    )
    print(
        f"KV cache: {cache.bytes_per_token} bytes per token per sequence, {cache.nbytes / 2**20:.2f} MiB "
        f"for {prompt.shape[0]} x {cache.max_len} tokens"
    )
    del cache
    sample = {**sample, "eos_id": None}  # never stop early: every run decodes the same count
    _timed_generate(model, prompt, 4, True, args.seed, sample)  # warm-up: thread pools, kernels, RoPE tables
    results = {}
    for use_cache in [True, False] if args.no_cache else [True]:
        stamps = _timed_generate(model, prompt, args.max_new_tokens, use_cache, args.seed, sample)
        prefill_s, decode_s = stamps[1] - stamps[0], stamps[-1] - stamps[1]
        decode_tps = prompt.shape[0] * (len(stamps) - 2) / decode_s if decode_s else float("inf")
        name = "cached" if use_cache else "no_cache"
        print(
            f"{name:>8}: prefill {prompt.numel() / prefill_s:,.0f} tokens/s, decode {decode_tps:,.1f} tokens/s"
        )
        results[name] = decode_tps
    if len(results) == 2:
        print(f"decode speed-up from the KV cache: {results['cached'] / results['no_cache']:.1f}x")


def _timed_generate(model, prompt, new_tokens: int, use_cache: bool, seed: int, sample: dict) -> list[float]:
    """perf_counter at the start and at the arrival of each new token."""
    stamps = [time.perf_counter()]
    generator = torch.Generator(device=prompt.device).manual_seed(seed)
    generate(
        model,
        prompt,
        new_tokens,
        generator=generator,
        use_cache=use_cache,
        on_token=lambda _: stamps.append(time.perf_counter()),
        **sample,
    )
    return stamps


def write_attention_map(model, tokenizer: Tokenizer, ids: torch.Tensor, path: str, layer: int | None) -> None:
    from inspection.attention_image import draw_attention_grid, save_attention_png

    layer = model.config.n_layer - 1 if layer is None else layer
    if not 0 <= layer < model.config.n_layer:
        raise UserError(f"--layer must be in 0..{model.config.n_layer - 1}, got {layer}")
    ids = ids[:, -model.config.block_size :]
    probs = model.float().attention_maps(ids)[layer, 0]  # (H, T, T)
    labels = [tokenizer.decode([i]) for i in ids[0].tolist()]
    save_attention_png(draw_attention_grid(probs, labels, f"layer {layer}"), path)
    print(f"wrote {path} (layer {layer}, {ids.shape[1]} tokens)", file=sys.stderr)


def write_attention_html(model, tokenizer: Tokenizer, ids: torch.Tensor, path: str) -> None:
    from inspection.explorer import model_explorer, write_explorer

    ids = ids[:, -model.config.block_size :]
    labels = [tokenizer.decode([i]) for i in ids[0].tolist()]
    generator = torch.Generator().manual_seed(0)  # the induction probe, as in training: comparable scores
    page = model_explorer(
        model.float(), ids, labels, induction_period=32, generator=generator, title="generate.py"
    )
    try:
        write_explorer(path, page)
    except OSError as err:
        raise UserError(f"--attention_html {path}: {err.strerror}; pass a writable .html file path") from None
    print(f"wrote {path} (attention explorer, {ids.shape[1]} tokens)", file=sys.stderr)


def explain(model, tokenizer: Tokenizer, text: str, layer: int, head: int, device: torch.device) -> None:
    from inspection.attention_image import printable_label
    from inspection.explain import attention_steps, steps_as_text

    ids = tokenizer.encode(text)[-model.config.block_size :]
    if not ids:
        raise UserError("--explain_attention text is empty; pass a short sentence")
    labels = [printable_label(tokenizer.decode([i]), max_chars=7) for i in ids]
    steps = attention_steps(model.float(), torch.tensor([ids], device=device), layer, head)
    print(f"layer {layer}, head {head}, {len(ids)} tokens")
    print(steps_as_text(steps, labels))


def main(argv: list[str] | None = None) -> int:
    """Run the command: 0 on success, 2 with one `error:` line for a user mistake (common.errors)."""
    return run_command(lambda: run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
