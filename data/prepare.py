"""Tokenize ahead of training: `python -m data.prepare --config configs/<x>.yaml [--data.num_proc 8]`.

Reads only the `data:` section of a train.py config (other sections are ignored) and `--data.*` overrides,
and builds exactly what `train.py fit` with the same config would: the token cache (non-streaming, in
`data.num_proc` processes, resumable after a kill) or, with `data.streaming: true`, the tokenizer and the
validation tokens. `fit` then finds it and starts with no data work.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from common.errors import UserError, run_command


def parse(argv: list[str]) -> dict[str, Any]:
    """The `data` init arguments of TextDataModule from --config's data section and --data.* overrides."""
    import yaml
    from jsonargparse import ArgumentParser

    from data.datamodule import TextDataModule

    parser = ArgumentParser(
        prog="python -m data.prepare", description=__doc__.splitlines()[0], exit_on_error=False
    )
    parser.add_argument("--config", type=Path, help="a train.py YAML config; only its data: section is read")
    parser.add_class_arguments(TextDataModule, "data")
    config = _config_path(argv)
    if config is not None:
        path = Path(config)
        try:
            section = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("data") or {}
        except OSError as error:
            raise UserError(
                f"--config: cannot read {path} ({error.strerror}); pass a train.py config file"
            ) from None
        parser.set_defaults({f"data.{key}": value for key, value in section.items()})
    try:
        return dict(parser.parse_args(argv).data)
    except Exception as error:  # jsonargparse's ArgumentError: one line, as train.py prints it
        raise UserError(f"{' '.join(str(error).split())} (see: python -m data.prepare --help)") from error


def _config_path(argv: list[str]) -> str | None:
    """The value of --config (read first: its data section becomes the defaults the other flags override)."""
    for index, arg in enumerate(argv):
        if arg == "--config" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def prepare(argv: list[str]) -> int:
    """Build the data for the config; prints where it is."""
    from data.cache import prepare_stream, prepare_tokens
    from data.datamodule import TextDataModule

    module = TextDataModule(**parse(argv))
    settings = module.settings
    folder = (prepare_stream if settings.source.streaming else prepare_tokens)(settings)
    print(f"data: ready in {folder}; train.py fit with the same config will use it")
    return 0


def main() -> int:
    return run_command(lambda: prepare(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
