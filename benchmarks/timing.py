"""The one timing harness of the timing benchmarks.

A timing on a shared machine is only worth what is recorded next to it. :class:`Timing` records,
once per run, the command as it was really invoked (``sys.orig_argv``), the process's niceness
(``os.nice(0)``, so a ``nice -n 10`` in front shows whether or not anyone wrote it down), the
machine (cores, CPU model, memory), the git commit and whether the tree was clean, and the load
average (1/5/15 min) at the start and the end. :meth:`Timing.alternate` runs named variants
alternating (A, B, C, then B, C, A, then C, A, B ... over the repetitions, so that no variant
always runs first or always right after the same neighbour) with the load recorded before and
after every sample, and :meth:`Timing.write` writes ``results.json`` and ``results.md``: per group,
every variant's median and range, and its ratio to the group's baseline as the median of the
ratios of samples taken side by side (the same repetition).

    timing = Timing("Orchestration overhead", out_dir)
    timing.alternate("10 devices, 4 KB", {"raw": f, "edgefl": g}, repetitions=3, baseline="raw")
    timing.write(notes=["..."])

A variant is a callable that returns one sample: a number (the metric, in ``timing.unit``) or a
dict with the metric under ``"value"`` and anything else worth keeping beside it.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def load() -> list[float]:
    """The load average over 1, 5 and 15 minutes."""
    return [round(x, 2) for x in os.getloadavg()]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """The machine a timing ran on."""
    return {
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def niceness() -> int:
    """This process's niceness (0 unless started under ``nice`` or by a niced parent)."""
    return os.nice(0)


def invocation() -> dict:
    """How this process was really started: its argv as the interpreter got it, its niceness,
    the working directory, and the git commit of the tree the benchmark ran from."""
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    nice = niceness()
    command = shlex.join(argv)
    return {
        "argv": argv,
        "niceness": nice,
        "command": (f"nice -n {nice} " if nice else "") + command,
        "cwd": os.getcwd(),
        **git_state(),
    }


def command_line(module: str, argv: list[str] | None = None) -> str:
    """The command a benchmark records: as invoked when ``argv`` is None, else ``python -m module
    argv...`` (a call from Python, e.g. a test); with the process's real niceness either way."""
    if argv is None:
        return invocation()["command"]
    nice = niceness()
    return (f"nice -n {nice} " if nice else "") + shlex.join(["python", "-m", module, *argv])


def git_state(root: Path = ROOT) -> dict:
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                                 timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "clean": None if status is None else status == ""}


def rotation(names: list[str], repetition: int) -> list[str]:
    """The order of the variants in ``repetition``: ``names`` rotated left by ``repetition``."""
    if not names:
        return []
    k = repetition % len(names)
    return names[k:] + names[:k]


def paired_ratio(samples: list[dict], variant: str, baseline: str) -> dict | None:
    """Median (and range) of variant ÷ baseline over the repetitions that have both."""
    by_rep: dict[int, dict[str, float]] = {}
    for s in samples:
        if s.get("value") is not None:
            by_rep.setdefault(s["repetition"], {})[s["variant"]] = s["value"]
    ratios = [r[variant] / r[baseline] for r in by_rep.values()
              if variant in r and baseline in r and r[baseline] > 0]
    if not ratios:
        return None
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "pairs": len(ratios)}


def summarize(samples: list[dict], baseline: str | None) -> dict[str, dict]:
    """Per variant (in first-run order): median, min, max, n, and the paired ratio to baseline."""
    out: dict[str, dict] = {}
    for s in samples:
        out.setdefault(s["variant"], {"values": [], "failed": 0})
        if s.get("value") is None:
            out[s["variant"]]["failed"] += 1
        else:
            out[s["variant"]]["values"].append(s["value"])
    for name, row in out.items():
        values = row.pop("values")
        row.update(n=len(values), median=statistics.median(values) if values else None,
                   min=min(values, default=None), max=max(values, default=None))
        if baseline is not None and name != baseline:
            row["ratio_to_baseline"] = paired_ratio(samples, name, baseline)
    return out


class Timing:
    """One timing run: its context, its groups of alternated samples, and its results files."""

    def __init__(self, title: str, out_dir: Path, *, metric: str = "seconds", unit: str = "s",
                 scale: float = 1.0, settings: dict | None = None):
        """``scale`` multiplies values for the page only (1000 with ``unit="ms"`` on seconds)."""
        self.title, self.out_dir = title, Path(out_dir)
        self.metric, self.unit, self.scale = metric, unit, scale
        self.results: dict = {
            "title": title,
            "invocation": invocation(),
            "machine": machine(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "load_start": load(),
            "settings": settings or {},
            "metric": metric,
            "groups": {},
        }

    @classmethod
    def load_results(cls, path: Path, *, unit: str = "s", scale: float = 1.0) -> Timing:
        """A finished run's Timing, read back from its results.json (to rewrite its page)."""
        results = json.loads(Path(path).read_text())
        timing = cls.__new__(cls)
        timing.title, timing.out_dir = results["title"], Path(path).parent
        timing.metric, timing.unit, timing.scale = results["metric"], unit, scale
        timing.results = results
        return timing

    def alternate(self, group: str, variants: Mapping[str, Callable[[], float | dict | None]],
                  repetitions: int, *, baseline: str | None = None,
                  on_sample: Callable[[dict], None] | None = None) -> list[dict]:
        """Run every variant once per repetition, in rotated order; record each sample with the
        load before and after it. A variant that raises is recorded as failed (its error kept)
        and the others go on. Returns the group's samples."""
        if repetitions < 1:
            raise ValueError("repetitions must be at least 1")
        if baseline is not None and baseline not in variants:
            raise ValueError(f"baseline {baseline!r} is not one of the variants {list(variants)}")
        names = list(variants)
        samples: list[dict] = []
        self.results["groups"][group] = {"baseline": baseline, "variants": names,
                                         "repetitions": repetitions, "samples": samples}
        for rep in range(repetitions):
            for name in rotation(names, rep):
                sample = {"repetition": rep, "variant": name, "load_before": load()}
                t0 = time.perf_counter()
                try:
                    out = variants[name]()
                except Exception as e:  # one failed variant must not cost the others
                    out = None
                    sample["error"] = f"{type(e).__name__}: {e}"
                sample["wall_seconds"] = time.perf_counter() - t0
                sample["load_after"] = load()
                if isinstance(out, Mapping):
                    sample.update({k: v for k, v in out.items() if k != "value"})
                    out = out.get("value")
                sample["value"] = None if out is None or not math.isfinite(out) else float(out)
                samples.append(sample)
                if on_sample:
                    on_sample(sample)
        self.results["groups"][group]["summary"] = summarize(samples, baseline)
        return samples

    def summary(self, group: str) -> dict[str, dict]:
        return self.results["groups"][group]["summary"]

    def write(self, *, notes: list[str] = (), extra_md: list[str] = (),
              name: str = "results", final: bool = True) -> dict:
        """Write ``<name>.json`` and ``<name>.md`` into the output folder; returns the results.
        ``final=False``: a partial page written while the run goes on (its end not yet known)."""
        if final and "finished" not in self.results:  # a rewritten page keeps its run's
            self.results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
            self.results["load_end"] = load()
        self.results["notes"] = list(notes)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"{name}.json").write_text(json.dumps(self.results, indent=2) + "\n")
        (self.out_dir / f"{name}.md").write_text("\n".join(self.markdown(extra_md, name)) + "\n")
        return self.results

    def markdown(self, extra_md: list[str] = (), name: str = "results") -> list[str]:
        """The page's lines; ``name``: the json beside it (``<name>.json``)."""
        r = self.results
        inv, m = r["invocation"], r["machine"]
        loads = [s[k] for g in r["groups"].values() for s in g["samples"]
                 for k in ("load_before", "load_after")]
        one_min = [x[0] for x in loads] or [r["load_start"][0]]
        tree = {True: "clean", False: "with uncommitted changes", None: "unknown"}[inv["clean"]]
        lines = [
            f"# {self.title}",
            "",
            f"Command: `{inv['command']}` (niceness {inv['niceness']}, read from the process)",
            "",
            f"Commit: `{inv['commit']}`, tree {tree}. Machine: {m['cores']} cores, {m['cpu']}, "
            f"{m['ram_gb']} GB, Python {m['python']}. {r['started']} to {r.get('finished', '?')}.",
            "",
            f"Load average (1/5/15 min): {r['load_start']} at the start, {r.get('load_end')} at "
            f"the end; the 1-minute load ranged {min(one_min):.2f}–{max(one_min):.2f} over the "
            f"samples (each sample's load before and after is in {name}.json).",
            "",
            "Variants alternate within each group (rotated order per repetition); a ratio is the "
            "median over repetitions of the ratio of two samples taken side by side.",
        ]
        for group, g in r["groups"].items():
            summary = g.get("summary") or summarize(g["samples"], g["baseline"])
            lines += ["", f"## {group}", "",
                      f"{g['repetitions']} repetitions; {self.metric} in {self.unit}"
                      + (f"; ratios to `{g['baseline']}`." if g["baseline"] else "."), "",
                      f"| variant | median ({self.unit}) | min | max | n | failed | ratio "
                      "(median, range) |",
                      "|---|---|---|---|---|---|---|"]
            for name, row in summary.items():
                ratio = row.get("ratio_to_baseline")
                text = ("baseline" if name == g["baseline"] else "—" if not ratio else
                        f"**{ratio['median']:.2f}×** ({ratio['min']:.2f}–{ratio['max']:.2f})")
                lines.append(f"| {name} | {self._fmt(row['median'])} | {self._fmt(row['min'])} | "
                             f"{self._fmt(row['max'])} | {row['n']} | {row['failed']} | {text} |")
            errors = sorted({f"{s['variant']}: {s['error']}" for s in g["samples"] if "error" in s})
            lines += [f"- failed: {e}" for e in errors]
        lines += list(extra_md)
        if r.get("notes"):
            lines += ["", "## Notes", ""] + [f"- {n}" for n in r["notes"]]
        return lines

    def _fmt(self, value: float | None) -> str:
        if value is None:
            return "—"
        v = value * self.scale
        return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"
