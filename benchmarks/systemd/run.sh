#!/usr/bin/env bash
# docs/deployment.md §4 run literally, on Debian 12 with systemd as PID 1: a debootstrapped root
# booted in its own PID and mount namespaces (it shares this machine's network: its broker listens
# on port 1883), once as root and once as a normal user with sudo, each from a fresh copy of the
# root. The command lines come from the doc itself (benchmarks/systemd/docsteps.py); then the
# checks of step 7 and of §6's export: the run finished with a model, the killed device is
# restarted by systemd, a server restart resumes, and the exported model scores on the device's
# own class-named image folders. Writes benchmarks/systemd/results.json and results.md.
# Needs root, debootstrap, the host's install (.venv) and Fashion-MNIST. ~10 minutes; not in CI.
#
#   sudo bash benchmarks/systemd/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
HERE=benchmarks/systemd
HOST_PY=${HOST_PY:-$REPO/.venv/bin/python}
BASE=${SYSD_BASE:-/var/tmp/edgefl-systemd-base}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
[ "$(id -u)" = 0 ] || { echo "run as root: it boots systemd in a namespace" >&2; exit 1; }
WORK=$(mktemp -d /var/tmp/edgefl-systemd.XXXXXX)
LOG=$WORK/log.txt
COMMIT="$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +dirty)"   # before the logs land beside it
say() { echo "[systemd-check $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

# Raspberry Pi OS Lite is Debian 12 with systemd, sudo and python3; python3-venv comes from the doc.
if ! [ -x "$BASE/lib/systemd/systemd" ]; then
  say "debootstrap Debian 12 into $BASE"
  debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,sudo,python3,ca-certificates,procps \
    bookworm "$BASE" "$MIRROR" >>"$LOG" 2>&1
fi

boot() {  # $1: the root; systemd as PID 1 of new PID/mount/UTS/IPC namespaces
  local r=$1 extra=""
  for d in /opt/wheels /opt/pypi /opt/pypi-more /etc/xdg/pip; do   # this build machine's pip sources
    [ -e "$d" ] && mkdir -p "$r$d" && extra="$extra mount --bind -o ro $d $r$d;"
  done
  setsid unshare --pid --fork --mount --uts --ipc --propagation private bash -c "
    mount --bind $r $r; mount -t proc proc $r/proc; mount --rbind /sys $r/sys; mount --rbind /dev $r/dev
    mount -t tmpfs tmpfs $r/run; mount -t tmpfs tmpfs $r/tmp; $extra hostname pi-07
    exec chroot $r /lib/systemd/systemd --system --log-target=console" >>"$WORK/boot.log" 2>&1 &
  for _ in $(seq 60); do
    PID1=$(pgrep -f "^/lib/systemd/systemd --system --log-target=console" | while read -r p; do
      [ "$(readlink /proc/$p/root)" = "$r" ] && echo "$p"; done | head -1)
    [ -n "$PID1" ] && in_root systemctl is-system-running 2>/dev/null | grep -qE "running|degraded" && return 0
    sleep 2
  done
  return 1
}
in_root() { nsenter -t "$PID1" -p -m -u -i --root="/proc/$PID1/root" --wd="/proc/$PID1/root/root" \
  env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }

declare -A R
for mode in root user; do
  r=$WORK/$mode-root
  say "$mode: a fresh copy of the root"
  cp -a "$BASE" "$r"
  # this machine reaches PyPI through a proxy CA and keeps torch in a local wheel folder (not the doc's)
  cp /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/ca-certificates.crt"
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\nfind-links = /opt/wheels\nextra-index-url = file:///opt/pypi/simple file:///opt/pypi-more/simple\nconstraint = /etc/xdg/pip/constraints.txt\n' > "$r/etc/pip.conf"
  echo "127.0.1.1 pi-07" >> "$r/etc/hosts"
  chroot "$r" systemctl mask serial-getty@ttyS0.service console-getty.service getty@tty1.service >/dev/null 2>&1
  if [ $mode = user ]; then
    chroot "$r" useradd -m -s /bin/bash -G sudo pi
    echo 'pi ALL=(ALL) NOPASSWD: ALL' > "$r/etc/sudoers.d/010_pi-nopasswd"; chmod 0440 "$r/etc/sudoers.d/010_pi-nopasswd"
    home=/home/pi
  else
    home=/root
  fi
  # what scp would have brought: the packed tree, and the device's own images (class-named folders)
  git archive --format=tar.gz -o "$r$home/edgefl-src.tar.gz" HEAD
  "$HOST_PY" - "$r$home/my-images" <<'PY'
import re, sys
from pathlib import Path
import numpy as np
from PIL import Image
from edgefl.data import load_dataset
ds = load_dataset("fashion-mnist", "train")
pick = np.random.default_rng(7).choice(len(ds), 1000, replace=False)
for i in pick:
    name = re.sub(r"[^a-z0-9]+", "-", ds.info.class_names[int(ds.y[i])].lower()).strip("-")
    d = Path(sys.argv[1]) / name
    d.mkdir(parents=True, exist_ok=True)
    Image.fromarray(ds.x[i, 0].numpy()).save(d / f"{i}.png")
PY
  { echo 'wait_for_round() { for _ in $(seq 150); do sudo journalctl -u edgefl-device --no-pager | grep -q "\] round 1 " && { sudo journalctl -u edgefl-device --no-pager | tail -4; return 0; }; sleep 2; done; return 1; }'
    if [ $mode = root ]; then "$HOST_PY" -m benchmarks.systemd.docsteps --root; else "$HOST_PY" -m benchmarks.systemd.docsteps; fi
  } > "$r$home/steps.sh"
  [ $mode = user ] && chroot "$r" chown -R pi: /home/pi
  boot "$r" || { say "$mode: systemd did not come up"; exit 1; }
  say "$mode: systemd is PID 1 (host pid $PID1); running §4's commands"
  t0=$(date +%s)
  set +e
  if [ $mode = user ]; then
    in_root runuser -u pi -- env HOME=/home/pi bash -c 'cd ~ && bash ~/steps.sh' >"$WORK/$mode-steps.log" 2>&1
  else
    in_root bash -c 'cd ~ && bash ~/steps.sh' >"$WORK/$mode-steps.log" 2>&1
  fi
  rc=$?
  set -e
  R[$mode.steps_rc]=$rc; R[$mode.steps_s]=$(( $(date +%s) - t0 ))
  say "$mode: the doc's commands exited $rc in ${R[$mode.steps_s]} s (log: $WORK/$mode-steps.log)"
  # the checks, as root inside
  cat > "$r/root/checks.sh" <<'CHK'
set -u
check() { local name=$1; shift; if "$@" >/dev/null 2>&1; then echo "PASS $name"; else echo "FAIL $name"; fi; }
for _ in $(seq 120); do systemctl is-active -q edgefl-server || break; sleep 2; done
journalctl -u edgefl-server --no-pager | tail -3
check "server finished with a result" grep -q "mean test accuracy" /var/lib/edgefl/runs/lab/summary.md
check "the device's model reached the run" test -s /var/lib/edgefl/runs/lab/models/pi-07.safetensors
cd /root
/opt/edgefl/venv/bin/edgefl export --run /var/lib/edgefl/runs/lab --all --out /root/onnx 2>&1 | tail -1
acc=$(/opt/edgefl/venv/bin/edgefl infer /root/onnx/pi-07.onnx --dataset imagefolder:/var/lib/edgefl/data --json 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['accuracy'])")
echo "exported model on the device's folders: $acc"
check "exported model scores on the device's class-named folders (> 0.5)" python3 -c "import sys; sys.exit(not $acc > 0.5)"
# step 7: a longer run; the device killed mid-run is restarted by systemd
sed -i 's/^rounds = .*/rounds = 40/' /etc/edgefl/server.toml
rm -rf /var/lib/edgefl/runs /var/lib/edgefl/checkpoints
systemctl restart edgefl-server; systemctl restart edgefl-device
for _ in $(seq 150); do journalctl -u edgefl-device --no-pager --since "-60s" | grep -q "\] round 2 " && break; sleep 2; done
before=$(systemctl show -p MainPID --value edgefl-device)
systemctl kill -s KILL edgefl-device
sleep 15
after=$(systemctl show -p MainPID --value edgefl-device)
echo "device pid $before killed; running again as $after"
check "systemctl kill -s KILL: running again 15 s later" systemctl is-active -q edgefl-device
check "it is a new process" test "$before" != "$after" -a "$after" != 0
for _ in $(seq 100); do journalctl _PID=$after --no-pager | grep -q "\] round " && break; sleep 2; done
check "the restarted device trains again" bash -c "journalctl _PID=$after --no-pager | grep -q '\] round '"
last=$(grep -c . /var/lib/edgefl/runs/lab/rounds.jsonl)
systemctl kill -s KILL edgefl-server
for _ in $(seq 100); do journalctl -u edgefl-server --no-pager --since "-30s" | grep -q "round $((last + 2))/40" && break; sleep 2; done
journalctl -u edgefl-server --no-pager | grep -E "resum|round [0-9]+/40" | tail -3
check "the killed server resumes after its last completed round" bash -c "journalctl -u edgefl-server --no-pager --since '-200s' | grep -q 'round $((last + 2))/40'"
systemctl stop edgefl-device edgefl-server edgefl-mosquitto
CHK
  in_root bash /root/checks.sh >"$WORK/$mode-checks.log" 2>&1 || true
  cat "$WORK/$mode-checks.log" >>"$LOG"
  R[$mode.pass]=$(grep -c "^PASS" "$WORK/$mode-checks.log" || true)
  R[$mode.fail]=$(grep -c "^FAIL" "$WORK/$mode-checks.log" || true)
  R[$mode.checks]=$(grep -E "^(PASS|FAIL)" "$WORK/$mode-checks.log" | paste -sd';' -)
  R[$mode.accuracy]=$(sed -n "s/^exported model on the device's folders: //p" "$WORK/$mode-checks.log")
  say "$mode: ${R[$mode.pass]} checks passed, ${R[$mode.fail]} failed"
  kill -9 "$PID1" 2>/dev/null || true
  sleep 2
  cp "$WORK/$mode-steps.log" "$WORK/$mode-checks.log" "$REPO/$HERE/" 2>/dev/null || true
  rm -rf "$r"
done

for k in "${!R[@]}"; do printf '%s\t%s\n' "$k" "${R[$k]}"; done > "$WORK/results.tsv"
"$HOST_PY" - "$REPO/$HERE" "$COMMIT" \
  "$(cut -d' ' -f1-3 /proc/loadavg)" "$WORK/results.tsv" <<'PY'
import datetime
import json
import sys
from pathlib import Path

out, commit, load, tsv = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
r = dict(line.split("\t", 1) for line in tsv.read_text().splitlines() if "\t" in line)
res = {"commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
       "load_at_end": load, "results": dict(sorted(r.items()))}
(out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
lines = ["# docs/deployment.md §4 run literally under systemd", "",
         f"`sudo bash benchmarks/systemd/run.sh` at `{commit}`, {res['date']}, load (1/5/15 min) at the end {load}.",
         "Debian 12 (debootstrap minbase + systemd, sudo, python3), systemd as PID 1 in its own PID and mount",
         "namespaces; the command lines are the doc's own (`benchmarks/systemd/docsteps.py` names each",
         "replacement: scp, the editors, the printed passwords, the follow-mode journal). Logs beside this file.", ""]
for mode in ("root", "user"):
    who = "As root (sudo left out, sudo -u → runuser)" if mode == "root" else "As a normal user with sudo"
    lines += [f"## {who}", "", f"- the doc's commands exited {r.get(mode + '.steps_rc')} in {r.get(mode + '.steps_s')} s",
              f"- the exported model on the device's own image folders: accuracy {r.get(mode + '.accuracy')}"]
    lines += [f"- {c}" for c in r.get(mode + ".checks", "").split(";") if c]
    lines.append("")
(out / "results.md").write_text("\n".join(lines))
print("\n".join(lines))
PY
rm -rf "$WORK"
