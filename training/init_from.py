"""`--model.init_from NAME`: a run that starts from a pretrained model's architecture, weights and tokenizer.

Before anything is written, the model's config and tokenizer (no weights) fill the model keys, so config.yaml and
the checkpoints describe the model really trained; LitGPT loads the weights at the start of a fresh fit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from common.errors import UserError
from data.tokenizer import Tokenizer
from interop import Source, read_config, read_tokenizer
from interop.tokenizer_files import same_backend
from model import ModelConfig

# Training choices a fine-tuning run may set; every other ModelConfig field is the pretrained architecture.
TRAINING_FIELDS = ("dropout", "init_std")
# Linked from data.vocab_size / data.block_size (training/cli.py), checked against the model as data keys.
LINKED_FIELDS = ("vocab_size", "block_size")


@dataclass(frozen=True)
class Pretrained:
    """What a run needs from its init_from model before the weights."""

    source: Source
    config: ModelConfig
    tokenizer: Tokenizer


def apply_init_from(config, explicit) -> Pretrained | None:
    """Check a parsed config against its model.init_from and fill the model keys from it; `explicit` holds only
    the keys the user set (None: nothing counts as set)."""
    model, data = config.model, config.data
    name = model.get("init_from")
    if not name:
        if model.get("init_revision"):
            raise UserError(
                "model.init_revision is set without model.init_from; name the model to start from"
            )
        return None
    source, pretrained_config = read_config(str(name), model.get("init_revision"))  # weights are not read
    pretrained = Pretrained(source, pretrained_config, read_tokenizer(source.path))
    fields = dataclasses.asdict(pretrained.config)
    given_model = dict((explicit or {}).get("model") or {})
    given_data = dict((explicit or {}).get("data") or {})
    _refuse_architecture_keys(name, fields, given_model)
    _check_data_keys(name, pretrained, given_data, data)
    for key, value in fields.items():
        if key not in TRAINING_FIELDS:
            model[key] = value
    data.vocab_size = pretrained.config.vocab_size
    data.tokenizer_path = None  # checked to hold the model's own tokenizer, which the data module now gets
    return pretrained


def _refuse_architecture_keys(name: str, fields: dict, given: dict) -> None:
    for key, value in given.items():
        if key in fields and key not in TRAINING_FIELDS + LINKED_FIELDS and value != fields[key]:
            raise UserError(
                f"model.{key}={value!r} is set together with model.init_from {name} ({key}={fields[key]!r}): "
                f"the architecture comes from the pretrained model; drop model.{key}"
            )


def _check_data_keys(name: str, pretrained: Pretrained, given: dict, data) -> None:
    config = pretrained.config
    vocab = given.get("vocab_size")
    if vocab is not None and vocab != config.vocab_size:
        raise UserError(
            f"data.vocab_size={vocab} disagrees with model.init_from {name}, which has {config.vocab_size} "
            "token ids; drop data.vocab_size (it follows the model)"
        )
    if data.block_size > config.block_size:
        raise UserError(
            f"data.block_size={data.block_size} is longer than the {config.block_size}-token context of "
            f"model.init_from {name}; use data.block_size <= {config.block_size}"
        )
    path = data.get("tokenizer_path")
    if path and not _holds_tokenizer(Path(path).expanduser(), pretrained.tokenizer):
        raise UserError(
            f"data.tokenizer_path={path} is not the tokenizer of model.init_from {name}; drop "
            "data.tokenizer_path (a fine-tuning run tokenizes with the model's own)"
        )


def _holds_tokenizer(path: Path, tokenizer: Tokenizer) -> bool:
    try:
        return same_backend(path, tokenizer)
    except FileNotFoundError:
        raise UserError(f"data.tokenizer_path: {path} does not exist; pass a tokenizer.json file") from None
    except (ValueError, KeyError):  # not JSON, or not a tokenizers file
        return False
