"""Imported by the fork server, last (:data:`edgefl.runtime.processes.KEEP_DATA`), and by nothing
else: it keeps the datasets :data:`~edgefl.runtime.processes.KEEP_DATA_ENV` names
(:func:`~edgefl.runtime.processes.keep_named_datasets`), so that the processes it forks read them
from memory instead of each decompressing them again (a device of ``edgefl simulate --transport
mqtt``: 0.3 s of CPU for Fashion-MNIST's training images), then freezes the heap
(:func:`gc.freeze`): the garbage collections of every forked child, and of the fork server as it
exits, skip what it imported (torch: millions of objects) instead of walking it each time.

Its warning filter holds in every child: under ``python -m edgefl.cli.main``, multiprocessing
prepares each forked child by running that module again as ``__mp_main__``, which the fork server
imported already, and runpy's RuntimeWarning about it went to the console once per device."""

from __future__ import annotations

import gc
import warnings

from edgefl.runtime.processes import keep_named_datasets

warnings.filterwarnings(
    "ignore", message=r"'edgefl\.cli\.main' found in sys\.modules", category=RuntimeWarning
)
keep_named_datasets()
gc.freeze()
