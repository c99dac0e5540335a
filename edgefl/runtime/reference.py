"""Reference runs: the same devices without federation, to show what the federation adds.

``local_reference(cfg, method)`` runs ``cfg`` with ``method`` (the caller names the method that
exchanges nothing: ``local``) in memory — the same partition,
tiers, seeds, local budget and evaluation, only nothing is exchanged — and caches the result by
the resolved configuration, so a demo or a benchmark that repeats a run pays for it once. Local
devices exchange nothing, so the in-memory run is exactly what the same devices reach over MQTT.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from edgefl.config import RunConfig, run_key_dump

log = logging.getLogger(__name__)

#: How the server combines what devices send: Local sends nothing, so these never change it (the
#: reference runs at their defaults).
_SERVER_SIDE = {"server_opt", "server_opt_lr", "server_opt_betas", "server_opt_eps", "aggregation",
                "buffer"}
#: Settings that do not change what a device learns alone.
_NOT_PART_OF_THE_RUN = {
    "out_dir",
    "run_name",
    "threads",
    "options",
    "algorithm",
    "timeout",
} | _SERVER_SIDE


def reference_key(cfg: RunConfig) -> str:
    run = run_key_dump(cfg, _NOT_PART_OF_THE_RUN)
    return hashlib.sha256(json.dumps(run, sort_keys=True).encode()).hexdigest()[:16]


def local_reference(cfg: RunConfig, method: str, cache_dir: Path | None = None) -> dict[str, Any]:
    """The baseline ``method`` (Local) on ``cfg``'s fleet: accuracy overall, per tier, per device,
    per round. Runtime knows no method by name: the caller says which one is the baseline."""
    key = reference_key(cfg)
    path = Path(cache_dir) / f"{method}-{key}.json" if cache_dir is not None else None
    if path is not None and path.exists():
        return json.loads(path.read_text())
    from edgefl.report.recorder import read_rounds
    from edgefl.runtime.simulation import simulate

    log.warning("computing the %s reference for this fleet (once; cached in %s)", method, cache_dir)
    with tempfile.TemporaryDirectory(prefix="edgefl-reference-") as tmp:
        defaults = {k: RunConfig.model_fields[k].default for k in _SERVER_SIDE}
        reference_cfg = cfg.model_copy(update={"algorithm": method, "options": {}, "out_dir": tmp,
                                               "run_name": "reference", **defaults})
        summary = simulate(reference_cfg, plots=False)
        rounds = read_rounds(Path(tmp) / "reference")
    per_round = [
        {
            "round": r["round"],
            "mean_accuracy": r["eval"]["mean_accuracy"],
            "tier_accuracy": r["eval"]["tier_accuracy"],
        }
        for r in rounds
        if "eval" in r
    ]
    per_round.append({"round": cfg.rounds, "mean_accuracy": summary["mean_accuracy"],
                      "tier_accuracy": summary["tier_accuracy"]})
    reference = {
        "algorithm": method,
        "key": key,
        "mean_accuracy": summary["mean_accuracy"],
        "tier_accuracy": summary["tier_accuracy"],
        "client_accuracy": summary["client_accuracy"],
        "accuracy_per_round": per_round,
        "config": run_key_dump(cfg, _NOT_PART_OF_THE_RUN),
    }
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(reference, indent=1) + "\n")
    return reference
