#!/bin/bash
# tfcluster boot script: Compute Engine runs it as root on every boot (metadata startup-script).
# Idempotent: the Python environment is built once per TensorFlow version, everything else
# is re-checked on each boot. Readiness goes to the guest attribute tfcluster/ready: "ok",
# or "error: <what failed>" that `invoke up` shows next to the VM's name.
set -uo pipefail

TF_VERSION="2.21.0"
ROOT=/opt/tfcluster
VENV="$ROOT/venv"
MD=http://metadata.google.internal/computeMetadata/v1

md() { curl -fsS -H 'Metadata-Flavor: Google' "$MD/$1"; }
ready() { curl -fsS -X PUT -H 'Metadata-Flavor: Google' --data "$1" "$MD/instance/guest-attributes/tfcluster/ready" >/dev/null; }
fail() { echo "tfcluster startup: $*" >&2; ready "error: $*"; exit 1; }

ready "starting"
mkdir -p "$ROOT"

# 1. Python environment with a pinned TensorFlow GPU build (once per version).
stamp="$VENV/.installed-tensorflow-$TF_VERSION"
if [ ! -f "$stamp" ]; then
  python3 -m venv "$VENV" || fail "python3 -m venv failed; the image needs python3-venv"
  "$VENV/bin/pip" install -q --upgrade pip || fail "pip upgrade failed (no route to PyPI?)"
  "$VENV/bin/pip" install -q "tensorflow[and-cuda]==$TF_VERSION" "tf-keras==$TF_VERSION" \
    "tensorboard==$TF_VERSION" pillow numpy google-cloud-storage \
    || fail "pip install tensorflow[and-cuda]==$TF_VERSION failed"
  touch "$stamp"
fi
chmod -R a+rX "$ROOT"

# 2. The driver and GPU are visible (the image installs the driver on first boot).
if [ "$(md instance/attributes/install-nvidia-driver 2>/dev/null)" = "True" ]; then
  deadline=$((SECONDS + 900))
  until nvidia-smi -L >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || fail "nvidia-smi finds no GPU after 15 minutes: the NVIDIA driver did not load"
    sleep 10
  done
  "$VENV/bin/python" -c 'import sys, tensorflow as tf; sys.exit(0 if tf.config.list_physical_devices("GPU") else 1)' \
    || fail "TensorFlow $TF_VERSION sees no GPU although nvidia-smi does (CUDA libraries?)"
fi

# 3. The idle watchdog, delivered through metadata, restarted by systemd if it ever exits.
md instance/attributes/tfcluster-watchdog > "$ROOT/watchdog.py.new" || fail "metadata tfcluster-watchdog is missing"
mv "$ROOT/watchdog.py.new" "$ROOT/watchdog.py"
cat > /etc/systemd/system/tfcluster-watchdog.service <<UNIT
[Unit]
Description=tfcluster idle watchdog (stops or deletes this VM when idle)
After=network-online.target
Wants=network-online.target

[Service]
ExecStart=/usr/bin/python3 $ROOT/watchdog.py --gce --state-dir /var/lib/tfcluster
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload || fail "systemctl daemon-reload failed"
systemctl enable tfcluster-watchdog.service >/dev/null 2>&1
systemctl restart tfcluster-watchdog.service || fail "the idle watchdog did not start"

ready "ok"
