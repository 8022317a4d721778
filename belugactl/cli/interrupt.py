"""How a long-running server command ends on SIGINT: exit 130, one line naming what it left behind.

SIGTERM stays a clean stop with exit 0: systemd and `belugactl serve`'s supervisor stop services with
it and count any other status as a failure. SIGINT is a person's Ctrl-C, and scripts expect 130.
The line itself is printed centrally (cli/app.py), from the note set here.
"""

from __future__ import annotations

from typing import NoReturn


def exit_interrupted(state: str) -> NoReturn:
    """End the command as interrupted (exit 130); the CLI's one interrupt line says `state`."""
    from belugactl.errors import set_interrupt_note

    set_interrupt_note(state)
    raise KeyboardInterrupt
