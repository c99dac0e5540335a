"""Run outputs: resolved config, per-round metrics (JSONL), a summary (JSON + markdown)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from edgefl.report.runfiles import read_rounds  # noqa: F401  (re-exported)


def json_safe(obj: Any) -> Any:
    """JSON-safe: NaN becomes null (the JSON spec has no NaN)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


class RunRecorder:
    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.rounds_path = self.run_dir / "rounds.jsonl"
        self.rounds_path.write_text("")

    def write_config(self, config: dict[str, Any]) -> None:
        (self.run_dir / "config.json").write_text(json.dumps(json_safe(config), indent=2) + "\n")

    def append_round(self, record: dict[str, Any]) -> None:
        with self.rounds_path.open("a") as f:
            f.write(json.dumps(json_safe(record)) + "\n")

    def write_summary(self, summary: dict[str, Any]) -> None:
        (self.run_dir / "summary.json").write_text(json.dumps(json_safe(summary), indent=2) + "\n")
        (self.run_dir / "summary.md").write_text(summary_markdown(summary))


def result_text(s: dict[str, Any]) -> str:
    """The run's result in one line, never "nan": what was measured, and how."""
    acc, devices = s.get("mean_accuracy"), len(s.get("client_accuracy") or {})
    ended = (
        f"interrupted after round {s.get('rounds_completed', 0)} of {s['rounds']}: "
        if s.get("interrupted")
        else ""
    )
    if acc is None or acc != acc:
        return ended + "no accuracy measured (no device answered an evaluation)"
    text = (
        f"{ended}mean accuracy {100 * acc:.2f}% over {devices} device{'s' if devices != 1 else ''}"
    )
    late = s.get("accuracy_from_round") or {}
    if late and s.get("interrupted"):
        text += " (each device's last per-round evaluation)"
    elif late:
        text += (
            " ("
            + ", ".join(f"{d} from its round-{r} evaluation" for d, r in sorted(late.items()))
            + ": no answer to the final one)"
        )
    if s.get("unmeasured"):
        text += f"; never measured: {', '.join(s['unmeasured'])}"
    return text


def summary_markdown(s: dict[str, Any]) -> str:
    local = s.get("local_reference")
    acc = s.get("mean_accuracy")
    measured = acc is not None and acc == acc
    late = s.get("accuracy_from_round") or {}
    lines = [
        f"# {s['algorithm']} on {s.get('dataset', '?')}",
        "",
    ]
    if s.get("interrupted"):
        lines += [
            f"**Interrupted** (Ctrl-C) after round {s.get('rounds_completed', 0)} of "
            f"{s['rounds']}: "
            "this record holds what the completed rounds produced.",
            "",
        ]
    lines += [
        f"- rounds: {s.get('rounds_completed', s['rounds'])} of {s['rounds']}, devices: "
        f"{len(s.get('client_accuracy', {}))}, "
        f"wall time: {s['wall_seconds']:.1f} s",
        f"- mean test accuracy over devices (as the devices report it): **{100 * acc:.2f}%**"
        if measured
        else "- mean test accuracy over devices: not measured (no device answered an evaluation)",
    ]
    if late:
        lines.append(
            "- measured by the final evaluation except (their last per-round evaluation, marked "
            "*): " + ", ".join(f"{d} (round {r})" for d, r in sorted(late.items()))
        )
    if s.get("unmeasured"):
        lines.append(f"- never measured (no evaluation answered): {', '.join(s['unmeasured'])}")
    if local and measured:
        lines.append(
            "- Local (the same devices, data and budget, no federation): "
            f"{100 * local['mean_accuracy']:.2f}%; "
            f"the federation adds **{100 * (acc - local['mean_accuracy']):+.2f} points**"
        )
    lines += [
        f"- bytes per round: up {_mean(s['bytes_up_per_round']):,.0f}, down "
        f"{_mean(s['bytes_down_per_round']):,.0f} (mean)",
        "",
        "| tier | devices | accuracy (%) |" + (" Local (%) | gain (points) |" if local else ""),
        "|---|---|---|" + ("---|---|" if local else ""),
    ]
    tiers = s.get("tier_devices", {})
    for tier, acc in s["tier_accuracy"].items():
        row = f"| {tier} | {tiers.get(tier, '')} | {100 * acc:.2f} |"
        if local:
            ref = local["tier_accuracy"].get(tier)
            row += " — | — |" if ref is None else f" {100 * ref:.2f} | {100 * (acc - ref):+.2f} |"
        lines.append(row)
    if late or s.get("interrupted"):
        lines += ["", "| device | accuracy (%) | measured |", "|---|---|---|"]
        for d, a in sorted((s.get("client_accuracy") or {}).items()):
            how = f"round {late[d]} *" if d in late else "final evaluation"
            lines.append(f"| {d} | {100 * a:.2f} | {how} |")
    return "\n".join(lines) + "\n"


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def run_summary(
    cfg: Any,
    final: dict[str, Any],
    rounds: list[dict[str, Any]],
    tiers: dict[str, str],
    *,
    wall_seconds: float,
    run_dir: Path,
    **extra: Any,
) -> dict[str, Any]:
    """The summary of a finished run, the same for every transport (``--json`` prints it).

    ``final`` is what ``RoundLoop.run`` returned, ``rounds`` the round records this process saw,
    ``tiers`` each device's tier.
    """
    return {
        "algorithm": cfg.algorithm,
        "dataset": cfg.dataset,
        "rounds": cfg.rounds,
        "seed": cfg.seed,
        "mean_accuracy": final["mean_accuracy"],
        "tier_accuracy": final["tier_accuracy"],
        "tier_devices": {t: sum(x == t for x in tiers.values()) for t in final["tier_accuracy"]},
        "client_accuracy": final["client_accuracy"],
        "bytes_up_per_round": [r["bytes_up_total"] for r in rounds],
        "bytes_down_per_round": [r["bytes_down_total"] for r in rounds],
        "finish_bytes_down": final["finish_bytes_down"],  # the final downlink to every device
        "finish_failed": final["finish_failed"],  # devices that did not take it, and why
        # how the result was measured: "final-evaluation" (every device answered the final
        # evaluation), "mixed" or "last-round" (devices that did not: their last per-round
        # evaluation, by round)
        "measured_by": final.get("measured_by", "final-evaluation"),
        "accuracy_from_round": final.get("accuracy_from_round", {}),
        "unmeasured": final.get("unmeasured", []),
        "final_eval_failed": final.get("eval_failed", {}),
        "rounds_completed": final.get("rounds_completed", cfg.rounds),
        "interrupted": bool(final.get("interrupted", False)),
        "failed_per_round": [len(r["failed"]) for r in rounds],
        "accuracy_per_round": [
            {"round": r["round"], "mean_accuracy": r["eval"]["mean_accuracy"]}
            for r in rounds
            if "eval" in r
        ],
        # ε per device at the end (a run with differential privacy: its last round's ledger)
        **({"privacy": rounds[-1]["privacy"]} if rounds and "privacy" in rounds[-1] else {}),
        **extra,
        "wall_seconds": wall_seconds,
        "run_dir": str(run_dir),
    }


def finish_run(recorder: RunRecorder, summary: dict[str, Any], *, plots: bool = True) -> None:
    """Write the summary and the plots; a plot never costs the run its results."""
    import logging

    recorder.write_summary(summary)
    if not plots:
        return
    try:
        from edgefl.report.plots import plot_run

        plot_run(recorder.run_dir)
    except Exception as e:
        logging.getLogger(__name__).warning("could not plot %s: %s", recorder.run_dir, e)


def attach_reference(
    run_dir: Path,
    summary: dict[str, Any],
    name: str,
    reference: dict[str, Any],
    *,
    plots: bool = True,
) -> None:
    """Add a reference run (e.g. ``local_reference``) to a finished run's summary, page and
    plots."""
    summary[name] = reference
    # the run's files exist: do not truncate rounds.jsonl
    recorder = RunRecorder.__new__(RunRecorder)
    recorder.run_dir = Path(run_dir)
    recorder.write_summary(summary)
    if plots:
        from edgefl.report.plots import plot_run

        plot_run(recorder.run_dir)
