"""The generation tests' fixtures: tests/hf's tiny models and tokenizer, and a GGUF of one (gguf_of)."""

from tests.hf.conftest import make_model, tokenizer_json  # noqa: F401 (fixtures)
from tests.test_generate_ux import gguf_of  # noqa: F401 (fixture)
