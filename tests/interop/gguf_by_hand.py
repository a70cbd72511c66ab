"""GGUF files written by hand with the `gguf` package, each tensor stored as a test chooses."""

from __future__ import annotations

from pathlib import Path


def write_gguf(path: Path, model, tokenizer, store=None, architecture: str | None = None) -> Path:
    """A GGUF of `model` written by hand: `store(name, array)` gives each tensor's (data, raw ggml type or None)."""
    import gguf

    from interop.export_gguf import gguf_architecture, gguf_tensors, gguf_vocab, write_metadata

    writer = gguf.GGUFWriter(path, architecture or gguf_architecture(model.config))
    write_metadata(gguf, writer, model, gguf_vocab(tokenizer, model.config.vocab_size), "f32", "x")
    for name, tensor in gguf_tensors(model).items():
        data, raw_dtype = (store or (lambda _, array: (array, None)))(name, tensor.numpy())
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
