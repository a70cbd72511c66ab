"""The special token that the tokenizer (data/) and the Hugging Face export (model/) must agree on."""

EOS_TOKEN = "<|endoftext|>"
"""Document separator and stop token: placed between documents in training, ends generation."""
