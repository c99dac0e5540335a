#!/bin/bash
# Whether a code change left every method's training as it was: one tiny run of each method (3
# devices, 2 rounds, 900 images, seed 0) at an older commit and at the working tree, and each
# device's final accuracy compared. Usage: benchmarks/same_runs_methods.sh OLD_COMMIT [METHOD ...]
# (from the repository root, with its .venv). Prints one line a method: SAME or DIFF; exits 1 on
# any DIFF or failed run. The older code runs from a temporary worktree, removed at the end.
set -u
old_commit=${1:?usage: benchmarks/same_runs_methods.sh OLD_COMMIT [METHOD ...]}
shift
methods=("$@")
[ ${#methods[@]} -gt 0 ] || methods=(fedavg feddw fedhe fedhenn fedproto fedprox fedprox-dw fedrep
                                     fedvtc felo heterofl hierarchyfl local velo)
here=$(pwd)
python=$here/.venv/bin/python
work=$(mktemp -d)
trap 'git -C "$here" worktree remove --force "$work/old" >/dev/null 2>&1; rm -rf "$work"' EXIT
git worktree add -q --detach "$work/old" "$old_commit" || exit 1
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
status=0
accuracies() {  # root out -> the run's per-device final accuracies
  (cd "$1" && PYTHONPATH=$1 "$python" -m edgefl.cli.main simulate -a "$3" --clients 3 --rounds 2 \
    --train-samples 900 --eval-samples 100 --test-samples 300 --out "$2" >"$2.log" 2>&1) &&
    "$python" -c "import json, pathlib, sys
print(json.loads(next(pathlib.Path(sys.argv[1]).glob('*/summary.json')).read_text())
      ['client_accuracy'])" "$2"
}
for m in "${methods[@]}"; do
  if ! before=$(accuracies "$work/old" "$work/run-old-$m" "$m"); then
    echo "$m FAILED at $old_commit"; status=1; continue
  fi
  if ! after=$(accuracies "$here" "$work/run-new-$m" "$m"); then
    echo "$m FAILED here"; status=1; continue
  fi
  if [ "$before" = "$after" ]; then
    echo "$m SAME $after"
  else
    echo "$m DIFF $before -> $after"; status=1
  fi
done
exit $status
