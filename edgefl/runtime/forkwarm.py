"""Imported by the fork server, last (:data:`edgefl.runtime.processes.KEEP_DATA`):
decodes the datasets that :data:`~edgefl.runtime.processes.KEEP_DATA_ENV` names and keeps them
(:func:`edgefl.data.sources.keep_dataset`), so that the processes it forks read them from memory
instead of each decompressing them again (a device of ``edgefl simulate --transport mqtt``: 0.3 s
of CPU for Fashion-MNIST's training images). Without that variable it does nothing."""

from __future__ import annotations

import json
import logging
import os

from edgefl.data.sources import keep_dataset
from edgefl.runtime.processes import KEEP_DATA_ENV

log = logging.getLogger(__name__)


def keep_named() -> list[str]:
    """Keep the datasets the environment names; returns those kept. A dataset that cannot be
    read is left to its readers, who report why."""
    kept = []
    try:
        named = [(str(name), data_dir) for name, data_dir in
                 json.loads(os.environ.get(KEEP_DATA_ENV) or "[]")]
    except (ValueError, TypeError) as e:  # never stops the fork server: its children read alone
        log.warning("ignoring %s: %s", KEEP_DATA_ENV, e)
        return kept
    for name, data_dir in named:
        try:
            if keep_dataset(name, data_dir):
                kept.append(name)
        except Exception as e:  # noqa: BLE001 - the children read it themselves and say why
            log.warning("the fork server did not keep %s: %s", name, e)
    return kept


keep_named()
