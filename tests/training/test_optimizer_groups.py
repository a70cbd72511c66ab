"""AdamW decays the matrices only: norm gains keep their scale; every parameter is in exactly one group."""

from __future__ import annotations

from model import GPT, ModelConfig
from training.schedule import adamw_param_groups


def test_weight_decay_on_matrices_only_and_each_parameter_once():
    model = GPT(ModelConfig(vocab_size=32, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=16))
    decay, no_decay = adamw_param_groups(model, weight_decay=0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    names = {id(p): name for name, p in model.named_parameters()}  # a tied weight appears once
    norms = sorted(n for n in names.values() if "norm" in n)
    assert sorted(names[id(p)] for p in no_decay["params"]) == norms
    assert all(p.dim() == 2 for p in decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(names)
