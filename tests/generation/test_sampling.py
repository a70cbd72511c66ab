"""Logit filters and the sliding-window rule of generate."""

import pytest
import torch

from generation.sampling import GREEDY, Sampler, context_start, filter_logits, generate, penalize_repeats
from model import GPT, ModelConfig

LOGITS = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))


def kept(logits):
    return torch.isfinite(logits)[0].tolist()


def test_top_k_keeps_the_k_largest():
    assert kept(filter_logits(LOGITS, top_k=2)) == [True, True, False, False]


def test_top_p_keeps_the_smallest_set_reaching_p():
    assert kept(filter_logits(LOGITS, top_p=0.8)) == [True, True, False, False]
    assert kept(filter_logits(LOGITS, top_p=0.81)) == [True, True, True, False]
    assert kept(filter_logits(LOGITS, top_p=0.1)) == [True, False, False, False]


def test_min_p_drops_tokens_below_a_fraction_of_the_best():
    assert kept(filter_logits(LOGITS, min_p=0.5)) == [True, True, False, False]


def test_repetition_penalty_lowers_seen_tokens_only():
    logits = torch.tensor([[2.0, -1.0, 3.0]])
    out = penalize_repeats(logits, torch.tensor([[0, 1]]), 2.0)
    assert out.tolist() == [[1.0, -2.0, 3.0]]


def test_context_window_slides_by_half_when_full():
    assert context_start(0, 32, 32) == 0
    assert context_start(0, 33, 32) == 17  # 16 most recent tokens remain
    assert context_start(17, 48, 32) == 17
    assert context_start(17, 50, 32) == 34


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": 0.0}, "top_p"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"temperature": float("inf")}, "temperature must be a finite number"),
        ({"repetition_penalty": float("nan")}, "repetition_penalty must be a finite number"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty must be a finite number"),
    ],
)
def test_bad_sampling_arguments_name_the_argument(kwargs, word):
    model = GPT(ModelConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_kv_head=1, n_embd=16))
    args = {"max_new_tokens": 4} | kwargs
    with pytest.raises(
        ValueError, match=word
    ):  # a Sampler refuses a field when it is made, as ModelConfig does
        generate(
            model, torch.zeros(1, 2, dtype=torch.long), args.pop("max_new_tokens"), sampler=Sampler(**args)
        )


@pytest.mark.parametrize("temperature", [1e-45, 1e-300, 1e-6])
def test_a_tiny_temperature_samples_the_greedy_tokens(temperature):
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_kv_head=1, n_embd=16)).eval()
    prompt = torch.tensor([[1, 2, 3]])
    greedy = generate(model, prompt, 8, sampler=GREEDY)
    picked = generate(
        model, prompt, 8, sampler=Sampler(temperature=temperature, top_p=0.9, generator=torch.Generator())
    )
    assert torch.equal(picked, greedy)


def test_a_plain_decode_never_imports_the_compiler():
    # torch._dynamo takes 1.4 s to import: half of a small model's start, for a run that compiles nothing.
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, torch\n"
        "from generation.sampling import GREEDY, generate\n"
        "from model import GPT, ModelConfig\n"
        "model = GPT(ModelConfig(vocab_size=64, block_size=24, n_layer=2, n_head=4, n_kv_head=2, n_embd=32))\n"
        "generate(model, torch.zeros(1, 3, dtype=torch.long), 5, sampler=GREEDY)\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip() == "False", result.stderr[-2000:]


def test_a_model_compiled_in_place_decodes_eagerly_without_a_graph_per_position():
    """Training with `compile: true` compiles the GPT in place and its samples callback calls `generate`: a
    compiled forward would specialise on the cache position and be rebuilt at every step."""
    from torch._dynamo.utils import counters

    from generation import static_decode
    from generation.speculative import PromptLookup, speculative_generate

    def speculative():
        sampler = Sampler(temperature=0.8, generator=torch.Generator().manual_seed(2))
        return speculative_generate(model, prompt, 30, PromptLookup(), sampler=sampler)[0]

    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=64, block_size=24, n_layer=2, n_head=4, n_kv_head=2, n_embd=32))
    prompt = torch.randint(0, 64, (1, 6))
    expected = generate(
        model, prompt, 30, sampler=Sampler(temperature=0.8, generator=torch.Generator().manual_seed(1))
    )
    expected_speculative = speculative()
    torch._dynamo.reset()
    try:
        model.compile(
            backend="eager"
        )  # dynamo traces and guards as with inductor, without generating kernels
        model(prompt).sum().backward()  # a training step: the one graph training needs
        graphs = counters["stats"]["unique_graphs"]
        sampled = generate(
            model, prompt, 30, sampler=Sampler(temperature=0.8, generator=torch.Generator().manual_seed(1))
        )
        sampled_speculative = speculative()
        assert counters["stats"]["unique_graphs"] == graphs  # 30 tokens across a window jump, no new graph
        assert torch.equal(sampled, expected) and torch.equal(sampled_speculative, expected_speculative)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(static_decode, "BACKEND", "eager")
            generate(model, prompt, 30, sampler=GREEDY, compile=True)  # the static step's one graph
        assert counters["stats"]["unique_graphs"] == graphs + 1
    finally:
        torch._dynamo.reset()


def test_a_sampler_changed_by_replace_is_checked_again():
    import dataclasses

    from common.errors import UserError

    with pytest.raises(
        UserError, match="^repetition_penalty must"
    ):  # as generation_config.json's are applied
        dataclasses.replace(GREEDY, repetition_penalty=0.0)
    assert GREEDY.greedy and not Sampler().greedy


def test_the_repetition_penalty_reaches_the_greedy_choice():
    logits = torch.tensor([[3.0, 2.0, 1.0]])
    assert Sampler(0.0).next_token(logits, torch.tensor([[0]])).tolist() == [0]
    assert Sampler(0.0, repetition_penalty=2.0).next_token(logits, torch.tensor([[0]])).tolist() == [1]


def test_speculative_decoding_refuses_a_repetition_penalty():
    from common.errors import UserError
    from generation.speculative import PromptLookup, speculative_generate

    model = GPT(ModelConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_kv_head=1, n_embd=16))
    with pytest.raises(UserError, match="repetition penalty"):
        speculative_generate(model, torch.zeros(1, 3, dtype=torch.long), 4, PromptLookup(),
                             sampler=Sampler(repetition_penalty=1.2))  # fmt: skip


def test_a_row_that_stopped_repeats_the_first_stop_id_and_a_round_is_cut_after_the_last_stop():
    from generation.sampling import Stop

    stop = Stop((7, 9), 2, torch.device("cpu"))
    tokens, finished = stop.apply(torch.tensor([[9], [1]]))
    assert tokens.tolist() == [[9], [1]] and not finished  # the second id of the collection stops row 0
    tokens, finished = stop.apply(torch.tensor([[3], [2]]))
    assert tokens.tolist() == [[7], [2]] and not finished  # row 0 stopped at 9: it repeats the first id, 7
    tokens, finished = stop.apply(torch.tensor([[4, 5, 6], [1, 9, 8]]))  # a speculative round of three
    assert tokens.tolist() == [[7, 7], [1, 9]] and finished  # cut after the column where every row stopped


def test_non_finite_logits_name_the_first_module_whose_output_is_not_finite():
    # A model built in memory skips the load's weight check: decoding names where the NaN first shows.
    from generation.sampling import NonFiniteLogits

    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=64, block_size=24, n_layer=3, n_head=4, n_kv_head=2, n_embd=32))
    with torch.no_grad():
        model.blocks[1].mlp_norm.weight.fill_(float("nan"))
    with pytest.raises(NonFiniteLogits, match="first at blocks.1$"):
        generate(model, torch.zeros(1, 3, dtype=torch.long), 4, sampler=GREEDY)
