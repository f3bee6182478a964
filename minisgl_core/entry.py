"""The ``minisgl`` command's entry point: :func:`minisgl_core.cli.main`, imported here so that a
Ctrl-C while it loads (torch alone takes over a second) stops the command as one at any later
point does, with status 130 and no traceback. This module imports nothing heavy itself.

While the command's modules import, a Ctrl-C is only noted: raised as a KeyboardInterrupt there,
it could land in Python code that C++ runs during the import (a pybind11 callback of torch's),
which cannot pass it on and aborts the process ("terminate called after throwing an instance of
'pybind11::error_already_set'", status -6 and maybe a core file instead of 130)."""

from __future__ import annotations

import signal
from collections.abc import Callable


def _load_cli() -> Callable[[], int]:
    from minisgl_core.cli import main as cli_main

    return cli_main


def main() -> int:
    interrupted: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    except ValueError:  # (not the main thread: signals are not ours to handle)
        previous = None
    try:
        cli_main = _load_cli()
    except KeyboardInterrupt:  # (one raised by the import itself)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if interrupted:
        return 130  # 128 + SIGINT
    try:
        return cli_main()
    except KeyboardInterrupt:  # (cli.main answers one from a command; this, one while it loads)
        return 130
