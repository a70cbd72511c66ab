"""Sample text from a model, decoding incrementally from a KV cache.

    python generate.py --checkpoint runs/shakespeare --prompt "ROMEO:" --max_new_tokens 200
    python generate.py --checkpoint HuggingFaceTB/SmolLM2-135M-Instruct --chat

--checkpoint takes any model name interop resolves (our .ckpt or run directory, a Hugging Face folder or Hub
id, a .gguf file). No Lightning or wandb, so it starts fast. A user mistake prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import sys

import torch

from common.errors import OneLineParser, UserError, run_command
from common.threads import apply_thread_count
from cpu_kernels.quantized import QuantizedLinear
from generation.chat import Conversation, run_chat
from generation.checks import check_args, read_prompt, refuse_a_batch_too_big
from generation.compiled_step import compiled_step
from generation.model_defaults import model_sampler
from generation.sampling import NonFiniteLogits, generate
from generation.speculative import DraftModel, PromptLookup, check_draft
from generation.speed import report_decode_speed, report_speculative_speed, seeded, speculative_run
from generation.text import TextStream, encode_prompt, print_samples
from interop import load
from interop.gguf_blocks import KEPT_TYPES
from interop.source import classify
from model.config import DTYPES


class _HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):  # not for switches and unset options
    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.required:
            return action.help
        return super()._get_help_string(action)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(description=__doc__.split("\n\n")[0], formatter_class=_HelpWithDefaults)
    yes = {"action": "store_true"}
    # fmt: off
    p.add_argument("--checkpoint", required=True, help="a .ckpt, run dir, HF folder, Hub id (org/name) or .gguf")
    p.add_argument("--revision", help="branch, tag or commit of a Hub id")
    p.add_argument("--chat", **yes, help="converse: one user turn per stdin line, through the chat template")
    text = p.add_argument_group("prompt and output")
    text.add_argument("--prompt", help='text to continue ("" samples from nothing); else --prompt_file, stdin')
    text.add_argument("--prompt_file", help="read the prompt from this UTF-8 file")
    text.add_argument("--no_echo", **yes, help="print only the continuation, not the prompt before it")
    text.add_argument("--max_new_tokens", type=int, default=200, help="tokens to generate per sample")
    text.add_argument("--ignore_eos", **yes, help="go on past the end-of-text token (benchmarks)")
    text.add_argument("--num_samples", type=int, default=1, help="continuations, decoded as one batch")
    sampling = p.add_argument_group("sampling (generation/sampling.py: Sampler)")
    sampling.add_argument("--temperature", type=float, default=0.8, help="0 is greedy; higher is more random")
    sampling.add_argument("--top_k", type=int, help="sample only among the k most likely tokens")
    sampling.add_argument("--top_p", type=float, help="sample from the smallest set with this probability")
    sampling.add_argument("--min_p", type=float, help="drop tokens below this fraction of the best one")
    sampling.add_argument("--repetition_penalty", type=float, default=1.0, help="> 1 discourages repeats")
    sampling.add_argument("--seed", type=int, default=1337, help="seed of the sampling generator")
    decoding = p.add_argument_group("how the model runs")
    decoding.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, mps or auto")
    decoding.add_argument("--dtype", choices=[*DTYPES, "auto"], default="auto", help="auto: bf16 on CUDA")
    decoding.add_argument("--threads", type=int, help="CPU threads (default: the CPUs not busy, common/threads.py)")
    decoding.add_argument("--no_cache", **yes, help="recompute the whole context every step (reference)")
    decoding.add_argument("--compile", **yes, help="build (once: kept for later runs) the compiled decode step")
    decoding.add_argument("--keep_quantized", **yes, help="a .gguf: its 4/5/6/8-bit matrices stay in blocks "
                          "(the default on the CPU in float32)")
    decoding.add_argument("--dequantize", **yes, help="a .gguf: float weights from its blocks")
    decoding.add_argument("--benchmark", **yes, help="print prefill/decode speed (also --compile, --no_cache)")
    decoding.add_argument("--draft", metavar="CKPT", help="speculative decoding: a smaller model, same tokenizer")
    decoding.add_argument("--prompt_lookup", **yes, help="speculative decoding, drafting by n-gram copy")
    decoding.add_argument("--draft_k", type=int, default=4, help="tokens drafted per target forward")
    looking = p.add_argument_group("looking at attention (inspection/writers.py)")
    looking.add_argument("--attention_map", metavar="PNG", help="draw --layer's attention over the text")
    looking.add_argument("--attention_html", metavar="HTML", help="write the attention explorer of the text")
    looking.add_argument("--explain_attention", metavar="TEXT", help="print one head's scores, mask, softmax")
    looking.add_argument("--layer", type=int, help="layer for --attention_map (default last) or explain (0)")
    looking.add_argument("--head", type=int, default=0, help="head for --explain_attention")
    looking.add_argument("--force", **yes, help="replace an existing --attention_map or --attention_html file")
    # fmt: on
    args = p.parse_args(argv)
    unset = object()  # a second parse with this default everywhere tells which flags were given
    p.set_defaults(**dict.fromkeys(vars(args), unset))
    args.explicit = {name for name, value in vars(p.parse_args(argv)).items() if value is not unset}
    return args


def pick_device(name: str) -> torch.device:
    """The --device asked for, or one line naming the devices this machine and torch build offer."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    usable = {"cpu": 1, "cuda": torch.cuda.device_count(), "mps": int(torch.backends.mps.is_available())}
    try:
        device = torch.device(name)
    except RuntimeError:  # not a device name at all ("gpu")
        device = torch.device("meta")
    if device.type not in usable or (device.index or 0) >= usable[device.type]:
        offered = ", ".join(kind for kind, count in usable.items() if count)
        raise UserError(f"--device {name} is not available (this machine and torch build offer: {offered}); "
                        "use --device cpu or auto")  # fmt: skip
    return device


def note_kept_blocks(model: torch.nn.Module, args: argparse.Namespace) -> None:
    """One stderr line on what a GGUF's load kept in blocks (by default on the CPU, or asked with
    --keep_quantized), so a user knows which weights decode; nothing for a source without blocks."""
    layers = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, QuantizedLinear))]
    kept = [m for m in layers if isinstance(m, QuantizedLinear)]
    if not kept and not args.keep_quantized:
        return
    if not kept:
        print(f"note: --keep_quantized: {args.checkpoint} has no {'/'.join(KEPT_TYPES)} matrix to keep (its "
              "linear layers are float), so this run is the same as without the flag", file=sys.stderr)  # fmt: skip
        return
    size = sum(b.numel() * b.element_size() for m in kept for b in m.buffers()) / 1e6
    print(f"note: {len(kept)} of {len(layers)} linear layers kept in their GGUF blocks ({size:.0f} MB)",
          file=sys.stderr)  # fmt: skip


def run(args: argparse.Namespace) -> None:
    sampler = check_args(args)
    looks = args.attention_map or args.attention_html or args.explain_attention is not None
    if looks:
        from inspection import writers  # Pillow and numpy, only when a picture or table is asked for

        writers.check_outputs(args)  # before a long load or generation, not after
    device = pick_device(args.device)
    apply_thread_count(args.threads, torch.set_num_threads)  # busy cores make torch's own threads wait
    auto = torch.bfloat16 if device.type == "cuda" and not args.keep_quantized else torch.float32
    dtype = DTYPES.get(args.dtype, auto)
    # By default a GGUF's blocks stay where the row kernel reads them (the CPU, float32): the file's own weights,
    # ~5x fewer bytes a step than float32.
    by_default = device.type == "cpu" and dtype == torch.float32 and not args.dequantize
    keep = args.keep_quantized or (by_default and classify(args.checkpoint, args.revision)[0] == "gguf")
    loaded = load(args.checkpoint, args.revision, device, dtype, keep)
    model, tokenizer = loaded.model, loaded.tokenizer
    note_kept_blocks(model, args)
    if args.chat and tokenizer.chat_template is None:  # before any note about sampling
        raise UserError(f"--chat: {args.checkpoint} has no chat template (tokenizer_config.json or the GGUF's "
                        "tokenizer.chat_template); drop --chat and pass --prompt")  # fmt: skip
    sampler = model_sampler(sampler, loaded.source.hf_folder, args.explicit)
    sampler = seeded(sampler, args.seed, device)
    if args.chat:
        return run_chat(Conversation(model, tokenizer, sampler), sys.stdin, args.max_new_tokens)
    if looks:
        writers.check_layer_and_head(model.config, args.layer, args.head)  # before anything is generated
    if args.explain_attention is not None:
        return writers.explain_attention(model, tokenizer, args.explain_attention, args.layer or 0, args.head)
    prompt_text = read_prompt(args)
    prompt = encode_prompt(tokenizer, prompt_text, model.config.block_size, device)
    eos_id = None if args.ignore_eos else tokenizer.eos_ids
    echo = "" if args.no_echo else prompt_text
    if args.draft or args.prompt_lookup:  # speculative decoding
        make_drafter = drafter_factory(loaded, args, prompt.device)
        if args.benchmark:
            return report_speculative_speed(model, prompt, args.max_new_tokens, make_drafter, sampler, args.seed,
                                            k=args.draft_k)  # fmt: skip
        print(echo, end="", flush=True)
        return speculative_run(model, prompt, args.max_new_tokens, make_drafter(), TextStream(tokenizer),
                               k=args.draft_k, sampler=sampler, eos_id=eos_id)  # fmt: skip
    length = prompt.shape[1] + args.max_new_tokens
    refuse_a_batch_too_big(model, args.num_samples, length, device, compiled=args.compile)
    batch = prompt.expand(args.num_samples, -1).contiguous()
    if args.compile:  # the step an earlier --compile kept, or this one builds
        compiled_step(model, args.num_samples, length)
    if args.benchmark:
        report_decode_speed(model, batch, args.max_new_tokens, sampler, args.seed, compile=args.compile,
                            with_recompute=args.no_cache)  # fmt: skip
        return
    stream = TextStream(tokenizer) if args.num_samples == 1 else None
    try:
        print(echo if stream else "", end="", flush=True)  # inside: a Ctrl-C may land right after it
        out = generate(model, batch, args.max_new_tokens, sampler=sampler, eos_id=eos_id, on_token=stream,
                       use_cache=not args.no_cache, compile=args.compile)  # fmt: skip
    except KeyboardInterrupt:
        if stream is not None:
            stream.finish()
        print(flush=True)  # end the streamed line, so the "interrupted" message starts on its own
        raise
    if stream is None:
        print_samples(tokenizer, out[:, prompt.shape[1] :].tolist(), echo)
    else:
        stream.finish()  # the held-back tail of a partial character: no token will complete it now
        print()
    if args.attention_map:
        writers.write_attention_map(model, tokenizer, out[:1], args.attention_map, args.layer)
    if args.attention_html:
        writers.write_attention_html(model, tokenizer, out[:1], args.attention_html, prompt.shape[1])


def drafter_factory(loaded, args: argparse.Namespace, device: torch.device):
    """A maker of fresh drafters: n-gram lookup, or the --draft model (read once; the target's tokenizer)."""
    if not args.draft:
        return PromptLookup
    draft = load(args.draft, device=device, dtype=next(loaded.model.parameters()).dtype)
    try:
        check_draft(loaded.model, draft.model, loaded.tokenizer.sha256, draft.tokenizer.sha256)
    except UserError as err:
        raise UserError(f"--draft {args.draft}: {err}") from None
    return lambda: DraftModel(draft.model)


def main(argv: list[str] | None = None) -> int:
    """Run the command: 0 on success, 2 with one `error:` line for a user mistake (common.errors)."""
    return run_command(lambda: run_naming_the_model(parse_args(argv)))


def run_naming_the_model(args: argparse.Namespace) -> None:
    """`run`, with the model named when its output is not finite (plain, speculative or chat decoding)."""
    try:
        run(args)
    except NonFiniteLogits as err:
        raise UserError(f"{args.checkpoint}: {err}; its weights are broken (a NaN or inf in a tensor)") from None  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
