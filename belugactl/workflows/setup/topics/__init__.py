"""The setup topics, one module each; every module here that defines `TOPIC` is a topic.

Adding a topic is adding a module (and its test): the registry finds it, the planner plans it in
its `order`, teardown runs it in reverse, `--only` and shell completion accept its id, and the boot
unit re-applies it unless it `survives_reboot`.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from belugactl.workflows.setup.topic import SetupTopic


@cache
def all_topics() -> tuple[SetupTopic, ...]:
    """Every topic, in planning order. Imported on first use, so importing this package is cheap."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        topic = getattr(module, "TOPIC", None)
        if topic is not None:
            found.append(topic)
    found.sort(key=lambda t: t.order)
    for attr in ("id", "order"):
        values = [getattr(t, attr) for t in found]
        dupes = sorted({v for v in values if values.count(v) > 1})
        if dupes:
            raise RuntimeError(f"setup topics share the same {attr}: {dupes}")
    return tuple(found)


def topic_ids() -> tuple[str, ...]:
    """The ids `setup --only` accepts, in planning order (also for shell completion)."""
    return tuple(t.id for t in all_topics())


def boot_topic_ids() -> tuple[str, ...]:
    """Topics whose changes a reboot resets: what the boot unit re-applies."""
    return tuple(t.id for t in all_topics() if not t.survives_reboot)


def persistent_topic_ids() -> tuple[str, ...]:
    return tuple(t.id for t in all_topics() if t.survives_reboot)


def get(topic_id: str) -> SetupTopic:
    for topic in all_topics():
        if topic.id == topic_id:
            return topic
    raise KeyError(f"no setup topic {topic_id!r}; known: {', '.join(topic_ids())}")
