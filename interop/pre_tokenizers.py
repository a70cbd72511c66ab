"""llama.cpp's byte-level BPE pre-tokenizers (a GGUF file's `tokenizer.ggml.pre` names) as `tokenizers` pipelines:
one table, read in both directions: the GGUF reader builds a name's form, the GGUF export finds a tokenizer.json's
form and so its name (where llama.cpp's converter hashes the ids of a fixed text instead).
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Regex, normalizers, pre_tokenizers

from common.errors import UserError

# Llama 3's split (tokenizer.json's form; llama.cpp spells the case-insensitive group out per letter), and
# Qwen2's, which takes digits one at a time instead of in runs of up to three.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
DIGIT = r"\p{N}"  # Digits(individual_digits=true) splits off every character Unicode calls a number, as this


@dataclass(frozen=True)
class PreTokenizer:
    """What decides the ids before the merges, as tokenizer.json states it."""

    # Regexes, applied in order, each splitting every piece around its matches (`Split`, Isolated).
    splits: tuple[str, ...]
    byte_regex: bool  # whether the final ByteLevel step splits with GPT-2's regex itself (`use_regex`)
    # The tokenizers normalizer type the model family ships; llama.cpp never normalizes, so text that
    # normalization would change (not in NFC, for NFC) can split differently there.
    normalizer: str | None = None
    ignore_merges: bool = False  # whether a piece that is one vocabulary entry is taken whole first (Llama 3)


# llama.cpp's names for the forms we rebuild exactly.
PRE_TOKENIZERS = {
    "gpt-2": PreTokenizer((), byte_regex=True),
    "smollm": PreTokenizer((DIGIT,), byte_regex=True),
    "qwen2": PreTokenizer((QWEN2_SPLIT,), byte_regex=False, normalizer="NFC"),
    "llama-bpe": PreTokenizer((LLAMA3_SPLIT,), byte_regex=False, ignore_merges=True),
}
# Read as another form: a GGUF file without a pre-tokenizer name has always been read as GPT-2's split here.
READ_AS = {"default": "gpt-2"}


def readable(name: str) -> PreTokenizer | None:
    """The form a GGUF file's `tokenizer.ggml.pre` name stands for, None for one we cannot rebuild."""
    return PRE_TOKENIZERS.get(READ_AS.get(name, name))


def build(form: PreTokenizer):
    """(pre_tokenizer, normalizer or None) `tokenizers` objects of `form`."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=form.byte_regex)
    steps = [pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in form.splits]
    pre = pre_tokenizers.Sequence([*steps, byte_level]) if steps else byte_level
    normalizer = getattr(normalizers, form.normalizer)() if form.normalizer else None
    return pre, normalizer


def llamacpp_name(spec: dict, source: str) -> str:
    """llama.cpp's pre-tokenizer name for tokenizer.json `spec`, or a one-line UserError naming `source` and
    the field that differs."""
    splits, byte_regex = _split_steps(spec.get("pre_tokenizer"), source)
    names = [
        name
        for name, form in PRE_TOKENIZERS.items()
        if (form.splits, form.byte_regex) == (splits, byte_regex)
    ]
    if not names:
        raise UserError(
            f"{source}: tokenizer.json's pre_tokenizer splits as none of llama.cpp's pre-tokenizers we write "
            f"({', '.join(PRE_TOKENIZERS)}), so llama.cpp would tokenize it differently; export it to Hugging Face "
            "instead (python -m interop.export_hf)"
        )
    name, form = names[0], PRE_TOKENIZERS[names[0]]
    normalizer = (spec.get("normalizer") or {}).get("type")
    if normalizer != form.normalizer:
        raise UserError(
            f"{source}: tokenizer.json field normalizer is {normalizer or 'none'}, but llama.cpp's '{name}' "
            f"(which never normalizes) stands for {form.normalizer or 'none'}; llama.cpp would tokenize it differently"
        )
    if bool((spec.get("model") or {}).get("ignore_merges")) != form.ignore_merges:
        raise UserError(
            f"{source}: tokenizer.json field model.ignore_merges must be {str(form.ignore_merges).lower()} for "
            f"llama.cpp's '{name}', which {'takes' if form.ignore_merges else 'never takes'} whole words first"
        )
    return name


def _split_steps(pre: dict | None, source: str) -> tuple[tuple[str, ...], bool]:
    """(split regexes, ByteLevel's use_regex) of a tokenizer.json pre_tokenizer ending in ByteLevel."""
    steps = _flat(pre)
    last = steps[-1] if steps else {"type": None}
    if last.get("type") != "ByteLevel":
        raise UserError(
            f"{source}: tokenizer.json field pre_tokenizer.type must end in ByteLevel for llama.cpp's byte-level "
            f"BPE, not {last.get('type')}"
        )
    if last.get("add_prefix_space"):
        raise UserError(
            f"{source}: tokenizer.json field pre_tokenizer add_prefix_space: llama.cpp adds no prefix space"
        )
    return tuple(_split_pattern(step, source) for step in steps[:-1]), bool(last.get("use_regex", True))


def _flat(pre: dict | None) -> list[dict]:
    if pre is None:
        return []
    if pre.get("type") == "Sequence":
        return [step for inner in pre.get("pretokenizers", []) for step in _flat(inner)]
    return [pre]


def _split_pattern(step: dict, source: str) -> str:
    """The regex of one split step before the ByteLevel one."""
    if step.get("type") == "Digits" and step.get("individual_digits"):
        return DIGIT
    pattern = step.get("pattern") or {}
    if (
        step.get("type") == "Split"
        and "Regex" in pattern
        and step.get("behavior") == "Isolated"
        and not step.get("invert")
    ):
        return pattern["Regex"]
    raise UserError(
        f"{source}: tokenizer.json pre_tokenizer step {step.get('type')} is not a split llama.cpp runs "
        "(only Split with a Regex, Isolated, and Digits with individual_digits)"
    )
