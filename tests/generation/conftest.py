"""The generation tests' fixtures: tests/interop's tiny models and tokenizer, and a GGUF of one (gguf_of)."""

from tests.generation.test_generate_ux import gguf_of  # noqa: F401 (fixture)
from tests.tiny_models import make_model, tokenizer_json  # noqa: F401 (fixtures)
