"""Train a GPT from a YAML config: `python train.py fit --config configs/shakespeare.yaml`.

Every key is documented by `python train.py fit --help`; any key can be overridden on the command line,
e.g. `--model.n_layer 6` or `--data.data_files path/to/input.txt`. User mistakes print one line and exit
with status 2 (see common/errors.py for every exit code); set GQA_GPT_TRACEBACK=1 to see the full traceback.
"""

from __future__ import annotations

import sys

from common.errors import EXIT_INTERRUPTED, EXIT_TERMINATED, UserError, run_command


def fit() -> int | None:
    from common.library_internals import warn_untested_versions
    from training.checks import refuse_early

    refuse_early(sys.argv[1:])  # before Lightning's import: a refused flag costs no seconds of start-up
    warn_untested_versions()
    from jsonargparse import ArgumentError
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from checkpoints.save_on_stop import GracefulCtrlC
    from data.datamodule import TextDataModule
    from training import LitGPT
    from training.cli import GPTCLI

    ctrl_c = GracefulCtrlC()
    try:
        # exit_on_error=False turns jsonargparse's usage dump into an exception we print as one line; without
        # allow_abbrev=False a mistyped --trainer.max_step was silently taken as --trainer.max_steps.
        parser_kwargs = {"exit_on_error": False, "allow_abbrev": False}
        GPTCLI(LitGPT, TextDataModule, save_config_kwargs={"overwrite": True}, parser_kwargs=parser_kwargs,
               ctrl_c=ctrl_c)  # fmt: skip
    except SIGTERMException:  # also raised for the first Ctrl-C (see checkpoints/save_on_stop.py)
        print(ctrl_c.stopped, file=sys.stderr)
        return EXIT_INTERRUPTED if ctrl_c.pressed else EXIT_TERMINATED
    except ArgumentError as err:
        message = " ".join(str(err).split())
        # jsonargparse parses a config's text, so YAML's own errors say "<unicode string>": name the file.
        configs = [value for flag, value in zip(sys.argv, sys.argv[1:], strict=False) if flag == "--config"]
        message = message.replace('"<unicode string>"', " or ".join(configs) or "the config")
        raise UserError(f"{message} (see: python train.py fit --help)") from err
    return None


def main() -> int:
    return run_command(fit)


if __name__ == "__main__":
    sys.exit(main())
