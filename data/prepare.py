"""Tokenize ahead of training: `python -m data.prepare --config configs/<x>.yaml [--data.num_proc 8]`.

Builds exactly what `train.py fit` with the same config would (docs/data.md), from its `data:` section and
`model.init_from` (whose tokenizer replaces the BPE), so `fit` then finds it and starts at once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from common.errors import UserError, run_command

MODEL_KEYS = ("init_from", "init_revision")  # the model keys that decide the data: its tokenizer


def parse(argv: list[str]) -> dict[str, Any]:
    """{"data": TextDataModule's init arguments, "model": MODEL_KEYS} from --config and the overrides."""
    import yaml
    from jsonargparse import ArgumentParser

    from data.datamodule import TextDataModule

    parser = ArgumentParser(
        prog="python -m data.prepare", description=__doc__.split("\n\n")[0], exit_on_error=False
    )
    parser.add_argument("--config", type=Path, help="a train.py YAML config; its data: section is read")
    parser.add_class_arguments(TextDataModule, "data")
    parser.add_argument("--model.init_from", type=str | None, default=None, help="as in train.py fit")
    parser.add_argument("--model.init_revision", type=str | None, default=None, help="as in train.py fit")
    # --config is read first: its sections become the defaults the other flags override.
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--config")
    config = first.parse_known_args(argv)[0].config
    if config is None and not any(arg.startswith(("--data.", "--model.", "-h", "--help")) for arg in argv):
        # Nothing said what to prepare: building the default corpus's cache is rarely what was meant.
        raise UserError(
            "python -m data.prepare: pass --config configs/<name>.yaml (the config train.py fit will run) or "
            "--data.* flags saying what to tokenize"
        )
    if config is not None:
        path = Path(config)
        try:
            with path.open(encoding="utf-8") as stream:  # a stream, not its text: YAML's errors name the file
                sections = yaml.safe_load(stream) or {}
        except OSError as error:
            raise UserError(
                f"--config: cannot read {path} ({error.strerror}); pass a train.py config file"
            ) from None
        except yaml.YAMLError as error:  # one line, as train.py prints a bad config
            message = " ".join(str(error).split())
            raise UserError(
                f"--config: {message}; fix the YAML (see: python -m data.prepare --help)"
            ) from None
        except UnicodeDecodeError as error:
            raise UserError(
                f"--config {path} is not UTF-8 text (byte {error.start}: {error.reason}); pass a train.py config file"
            ) from None
        if not isinstance(sections, dict) or not all(
            isinstance(sections.get(key) or {}, dict) for key in ("data", "model")
        ):
            raise UserError(f"--config {path}: expected a train.py config (keys data:, model: and so on)")
        model = {key: value for key, value in (sections.get("model") or {}).items() if key in MODEL_KEYS}
        defaults = {f"data.{key}": value for key, value in (sections.get("data") or {}).items()}
        for key, value in (defaults | {f"model.{key}": value for key, value in model.items()}).items():
            try:
                parser.set_defaults({key: value})
            except KeyError:  # a data: key TextDataModule does not take
                raise UserError(
                    f"--config {path}: {key} is not a key of this command (see: python -m data.prepare --help)"
                ) from None
    try:
        parsed = parser.parse_args(argv)
    except Exception as error:  # jsonargparse's ArgumentError: one line, as train.py prints it
        raise UserError(f"{' '.join(str(error).split())} (see: python -m data.prepare --help)") from error
    return {"data": dict(parsed.data), "model": dict(parsed.model)}


def prepare(argv: list[str]) -> int:
    """Build the data for the config, as fit's data module would; prints where it is."""
    from data.datamodule import TextDataModule

    parsed = parse(argv)
    data, name = parsed["data"], parsed["model"]["init_from"]
    tokenizer = None
    if name:  # fit tokenizes with the pretrained model's own tokenizer (training/init_from.py does the same)
        from interop import read_tokenizer

        tokenizer = read_tokenizer(name, parsed["model"]["init_revision"])
        data.update(vocab_size=max(data["vocab_size"], tokenizer.vocab_size), tokenizer_path=None)
    module = TextDataModule(**data)
    if tokenizer is not None:
        module.use_tokenizer(tokenizer)
    module.setup()
    print(f"data: ready in {module.folder}; train.py fit with the same config will use it")
    return 0


def main() -> int:
    return run_command(lambda: prepare(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
