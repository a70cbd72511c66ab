"""How many repository files a reader opens to follow one decoded token, measured with `sys.setprofile`.

What is counted: the files under the repository root (tests/ and a .venv there excluded) holding a Python
function that is called while ONE token is decoded after the prefill, plus generate.py, the command line that
starts it (it is on the path by construction: `run` calls `generate`). The token goes through what `generate`
runs: `Context`, `sample_step` and `decode` (generation/sampling.py) with its stop rule, and the stream callback
(generation/text.py `TextStream`). The tokenizer is a stand-in defined here: decoding ids to text is
data/'s subject (data/tokenizer.py would be one more file), not how a token is computed. Not counted: the
prefill, building the model and cache, torch and the standard library.

- plain: eager decoding from a `KVCache`.
- compiled 4-bit: every linear layer a Q4_1-style `QuantizedLinear`, decoded by `StaticDecoder(compile=False)`:
  the forward the compiled step traces (`generate.py --keep_quantized --compile`), run eagerly so the profile
  sees the Python a reader follows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from cpu_kernels.quantized import QuantizedLinear
from generation.sampling import Context, Sampler, Stop, decode, sample_step
from generation.static_decode import StaticDecoder
from generation.text import TextStream
from model import GPT, KVCache, ModelConfig
from tests.conftest import ROOT

# Compiled 4-bit: cpu_kernels/ splits the kernel's loader (library.py) from the block packing (quantized.py).
PLAIN_MAX, COMPILED_4BIT_MAX = 6, 9


class StandInTokenizer:
    eos_ids = (0,)

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


def tiny_model() -> GPT:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=64)
    return GPT(config).eval()


def quantized(model: GPT) -> GPT:
    """`model` with every linear layer (the tied head included) kept as 4-bit codes with a scale and minimum."""
    g = torch.Generator().manual_seed(1)
    for name, module in list(model.named_modules()):
        if isinstance(module, torch.nn.Linear):
            out, inp = module.weight.shape
            codes = torch.randint(0, 16, (out, inp), generator=g)
            scale, minimum = torch.rand(out, inp // 32, generator=g) * 0.02, -torch.rand(out, inp // 32) * 0.1
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, QuantizedLinear(codes, scale, minimum, 4))
    return model


def files_of_one_token(context: Context) -> set[str]:
    """Repository files whose Python runs while one token is decoded after the prefill (see the docstring)."""
    sampler, stream = Sampler(temperature=0.8, top_k=20), TextStream(StandInTokenizer())
    step, stop = sample_step(context, sampler), Stop(0, 1, torch.device("cpu"))
    prompt = torch.randint(1, 64, (1, 8), generator=torch.Generator().manual_seed(2))
    seen: set[str] = set()

    def record(frame, event, arg) -> None:
        if event == "call" and not frame.f_code.co_filename.startswith("<"):  # not "<frozen codecs>"
            seen.add(frame.f_code.co_filename)

    with torch.inference_mode():
        seq = decode(prompt, 1, step, stop, stream)  # the prefill and its token, not counted
        sys.setprofile(record)
        try:
            decode(seq, 1, step, stop, stream)
        finally:
            sys.setprofile(None)
    files = {"generate.py"}
    for name in seen:
        path = Path(name).resolve()
        if path.is_relative_to(ROOT) and path.relative_to(ROOT).parts[0] not in ("tests", ".venv"):
            files.add(path.relative_to(ROOT).as_posix())
    return files


def test_plain_decoding_of_one_token_reads_few_files():
    model = tiny_model()
    files = files_of_one_token(Context(model, KVCache.for_model(model, 1)))
    assert "model/gpt.py" in files and "generation/text.py" in files  # the profile sees the path
    assert len(files) <= PLAIN_MAX, f"{len(files)} files: {sorted(files)}"


def test_compiled_4bit_decoding_of_one_token_reads_few_files():
    model = quantized(tiny_model())
    decoder = StaticDecoder(model, KVCache.for_model(model, 1), compile=False)
    files = files_of_one_token(Context(model, decoder.cache, decoder.decode))
    assert "cpu_kernels/quantized.py" in files and "generation/static_decode.py" in files
    assert len(files) <= COMPILED_4BIT_MAX, f"{len(files)} files: {sorted(files)}"
