"""What every stability sweep (a benchmark's recipe chosen on a validation split, issue 37) does
around its own rule: its command line, its cells' records, run or read from the cache, the commits
they ran at, the machine before and after (a ``--report-only`` rewrite keeps the ones its results
file recorded), its ``<name>.json`` and ``<name>.md``, and the page's provenance lines.
:func:`main` is all of it for a sweep that needs nothing else."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.cache import Cache, DirtyCode, run_cells
from benchmarks.cells import Cell
from benchmarks.common import machine
from edgefl.report.recorder import json_safe


def records(every: Sequence[Cell], cache: Cache, *, report_only: bool, workers: int,
            tmp_root: Path, run: Sequence[Cell] | None = None) -> list[dict | None]:
    """Each cell's record (None: not run), after running the cells of ``run`` (every cell by
    default) that the cache lacks, unless ``report_only``; a refusal to run from uncommitted code
    ends the process with its message."""
    if not report_only:
        try:
            run_cells(every if run is None else run, cache, workers=max(1, workers),
                      tmp_root=tmp_root)
        except DirtyCode as e:
            raise SystemExit(str(e)) from None
    return [cache.find(c) for c in every]


def commits(done: Sequence[dict]) -> dict[str, int]:
    """{commit (``+dirty`` where the code differed): cells run at it}, in first-seen order."""
    return dict(Counter(r.get("code", "unknown") for r in done))


def _recorded(results: Path) -> dict:
    return json.loads(results.read_text()).get("machine", {}) if results.exists() else {}


def machine_before(results: Path) -> dict:
    """The machine when the sweep started, as its results file recorded it, else as it is now
    (call it before running)."""
    return _recorded(results).get("before") or machine()


def machine_after(results: Path, report_only: bool) -> dict:
    """The machine now (call it after running), or as recorded for a ``--report-only`` rewrite."""
    recorded = _recorded(results)
    return recorded["after"] if report_only and recorded.get("after") else machine()


def parser(description: str, workers: int = 2, quick: str | None = None) -> argparse.ArgumentParser:
    """The options every sweep takes: ``--workers``, ``--report-only`` and ``--draft``, and
    ``--quick`` (its help ``quick``) for a sweep with a quick profile."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--workers", type=int, default=workers)
    p.add_argument("--report-only", action="store_true", help="rewrite from cached cells")
    p.add_argument("--draft", action="store_true", help="allow uncommitted code (marked)")
    if quick:
        p.add_argument("--quick", action="store_true", help=quick)
    else:
        p.set_defaults(quick=False)
    return p


def finish(result: dict, done: Sequence[dict], *, command: str, before: dict, after: dict,
           keys: Sequence[str], wall: bool = True) -> dict:
    """``result`` (the sweep's own summary) with what every sweep records after it: the command,
    the machine before and after, the commits of the ``done`` cells, their wall seconds (unless
    not ``wall``) and each one's ``keys``."""
    result.update(command=command, machine={"before": before, "after": after},
                  commits=commits(done))
    if wall:
        result["wall_seconds"] = [r["wall_seconds"] for r in done]
    result["runs"] = [{k: r.get(k) for k in keys} for r in done]
    return result


def write(out: Path, name: str, result: dict, markdown: Callable[[dict], str]) -> None:
    """``<out>/<name>.json`` and ``<out>/<name>.md`` (the page ``markdown`` writes)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(json_safe(result), indent=1) + "\n")
    (out / f"{name}.md").write_text(markdown(result))


def main(argv: Sequence[str] | None, description: str, here: Path, name: str,
         cells: Callable[..., list[Cell]], summarize: Callable[[list, list[Cell]], dict],
         markdown: Callable[[dict], str], *, command: str, keys: Sequence[str],
         quick: str | None = None, workers: int = 2, wall: bool = True,
         tmp_root: Path | None = None) -> dict:
    """A whole sweep from its command line (:func:`parser`): ``cells()`` (``cells(quick)`` for a
    sweep with a quick profile, into ``runs/bench-quick/<name>``) run from the cache
    ``<name>_cells`` (or read, with ``--report-only``), ``summarize(records, cells)`` finished
    (:func:`finish`; ``command`` recorded with `` --quick`` where it was given) and written
    (:func:`write`) as ``<name>.json`` and ``<name>.md``."""
    args = parser(description, workers, quick).parse_args(argv)
    out = Path.cwd() / "runs" / "bench-quick" / name if args.quick else here
    every = cells(args.quick) if quick else cells()
    cache = Cache(out / f"{name}_cells", draft=args.draft)
    results = out / f"{name}.json"
    before = machine_before(results)
    got = records(every, cache, report_only=args.report_only, workers=args.workers,
                  tmp_root=out / "tmp" if tmp_root is None else tmp_root)
    result = finish(summarize(got, every), [r for r in got if r is not None],
                    command=command + (" --quick" if args.quick else ""), before=before,
                    after=machine_after(results, args.report_only), keys=keys, wall=wall)
    write(out, name, result, markdown)
    recipe = f" {result['chosen_recipe']}" if "chosen_recipe" in result else ""
    print(f"chosen: {result['chosen']}{recipe}; results: {out / f'{name}.md'}")
    return result


def commits_text(result: dict) -> str:
    """"Cells by the commit they ran at: `<commit>` (n), …" (no closing stop)."""
    return "Cells by the commit they ran at: " + ", ".join(
        f"`{c}` ({n})" for c, n in result["commits"].items())


def machine_text(result: dict) -> str:
    """"Command: `…`. Machine: n cores, load … at the start (date), … at the end (date)" (the
    start as ``started`` where the results recorded only when the run started)."""
    before, after = result["machine"]["before"], result["machine"]["after"]
    start = (f"started {before['started']}" if "started" in before else
             f"load (1/5/15 min) {before.get('loadavg_1_5_15')} at the start "
             f"({before.get('date')})")
    return (f"Command: `{result['command']}`. Machine: {before.get('cores')} cores, {start}, "
            f"{after.get('loadavg_1_5_15')} at the end ({after.get('date')})")


def cell_minutes(result: dict) -> str:
    return f"{sum(result['wall_seconds']) / 60:.0f} cell-minutes"


def provenance(result: dict, tail: str, note: str = "") -> list[str]:
    """The page's provenance section: the commits (then ``note``), and the command and machine
    followed by ``tail``."""
    return ["", "## Provenance", "", commits_text(result) + "." + (" " + note if note else ""),
            machine_text(result) + "; " + tail, ""]


def opening(result: dict, title: str, doc: str | None, none: str) -> list[str]:
    """A sweep page's opening lines: ``title``, the docstring ``doc`` from its second paragraph
    to its "Run it" one, and the decision (``none``: the words when no candidate passed)."""
    chosen = (f"**Chosen: {result['chosen']}** ({json.dumps(result['chosen_recipe'])})."
              if result["chosen"] else "**Not decided yet.**"
              if "undecided" in result["status"].values() else none)
    return [title, "", (doc or "").split("\n\n", 1)[1].split("\n\nRun it")[0], "", chosen, ""]

