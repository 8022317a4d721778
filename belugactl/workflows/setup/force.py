"""The one place that decides what --force allows.

Topics mark steps: `destroys_data` (needs --force), with optionally a `refusal` (the error raised in
the step's place while planning without --force) or a `forced` replacement (the step to take with
--force). `resolve` applies those while planning; `refuse_without_force` stops an apply before
any destroying step runs, and says what would be destroyed.
"""

from __future__ import annotations

from collections.abc import Iterable

from belugactl.errors import BelugaError
from belugactl.model.setup_plan import Step


class ForceRequired(BelugaError):
    """The plan destroys data and --force was not given; nothing was changed."""


def resolve(steps: Iterable[Step], force: bool) -> list[Step]:
    """The steps as planned under `force`: replacements taken, refusals raised."""
    out = []
    for step in steps:
        if force and step.forced is not None:
            step = step.forced
        if step.needs_force and not force and step.refusal is not None:
            raise step.refusal
        out.append(step)
    return out


def refuse_without_force(steps: Iterable[Step], force: bool) -> None:
    risky = [s for s in steps if s.needs_force]
    if risky and not force:
        raise ForceRequired(
            f"{len(risky)} step(s) would destroy data; nothing was changed",
            why="\n".join(f"{s.id}: {s.summary}" + (f" ({s.note})" if s.note else "") for s in risky),
            fix="review with `belugactl plan`; rerun with --force to accept the loss of the pool's contents",
        )
