"""Train a GPT from a YAML config: `python train.py fit --config configs/shakespeare.yaml`.

Every key is documented by `python train.py fit --help`; any key can be overridden on the command line,
e.g. `--model.n_layer 6` or `--data.data_files path/to/input.txt`. User mistakes print one line; set
GQA_GPT_TRACEBACK=1 to see the full traceback instead.
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    from jsonargparse import ArgumentError
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from data import TextDataModule
    from training import LitGPT, NonFiniteLossError
    from training.cli import GPTCLI, RunAlreadyFinished
    from training.ctrl_c import GracefulCtrlC

    ctrl_c = GracefulCtrlC()
    try:
        # exit_on_error=False turns jsonargparse's usage dump into an exception we print as one line.
        GPTCLI(LitGPT, TextDataModule, save_config_kwargs={"overwrite": True}, parser_kwargs={"exit_on_error": False},
               ctrl_c=ctrl_c)  # fmt: skip
    except SIGTERMException:  # also raised for the first Ctrl-C (see training/ctrl_c.py)
        print(ctrl_c.stop_message(), file=sys.stderr)
        return 130 if ctrl_c.pressed else 143
    except RunAlreadyFinished as done:
        print(done, file=sys.stderr)
        return 0
    except ArgumentError as err:
        message = " ".join(str(err).split())
        print(f"error: {message} (see: python train.py fit --help)", file=sys.stderr)
        return 2
    except (ValueError, NonFiniteLossError, FileNotFoundError) as err:
        if os.environ.get("GQA_GPT_TRACEBACK"):
            raise
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2 if isinstance(err, ValueError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
