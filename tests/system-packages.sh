#!/usr/bin/env bash
# The system packages the test suite needs beside the venv (make test and .ci/run call this):
# real Fashion-MNIST (dataset-fashion-mnist), a Mosquitto broker for the MQTT tests, Debian's
# chromium for the dashboard's browser test (driven by Playwright; never `playwright install`)
# and systemd-analyze for deploy/'s unit files. Installed with apt-get when apt is usable and this
# runs as root; otherwise it names what is missing and how to install it, and the tests that need
# it fail with the same words.
set -euo pipefail
need=""
[ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || need="$need dataset-fashion-mnist"
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need="$need mosquitto"
[ -x /usr/bin/chromium ] || need="$need chromium"
command -v systemd-analyze >/dev/null 2>&1 || need="$need systemd"
[ -n "$need" ] || exit 0
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "installing the tests' system packages:$need"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need
else
  echo "the tests need these system packages, not installed here:$need" >&2
  echo "  install them as root (Debian/Ubuntu: sudo apt-get install$need); the tests that need" >&2
  echo "  them fail until then" >&2
fi
