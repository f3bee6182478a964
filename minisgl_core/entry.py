"""The ``minisgl`` command's entry point: :func:`minisgl_core.cli.main`, imported here so that a
Ctrl-C while it loads (torch alone takes over a second) stops the command as one at any later
point does, with status 130 and no traceback. This module imports nothing heavy itself."""

from __future__ import annotations


def main() -> int:
    try:
        from minisgl_core.cli import main as cli_main

        return cli_main()
    except KeyboardInterrupt:  # (cli.main answers one from a command; this, one while it loads)
        return 130  # 128 + SIGINT
