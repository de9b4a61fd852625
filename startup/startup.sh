#!/bin/bash
# tfcluster boot script: Compute Engine runs it as root on every boot (metadata startup-script).
# Idempotent: the Python environment is built once per TensorFlow version, everything else
# is re-checked on each boot. Readiness goes to the guest attribute tfcluster/ready as
# "<nonce>:<state>": the nonce `invoke up` wrote into the metadata just before this boot (guest
# attributes may survive a stop, so an old "ok" must not pass), and "starting", "ok" or
# "error: <what failed>", which `invoke up` shows next to the VM's name.
#
# Order matters for cost: the idle watchdog is installed and running before anything slow or
# fragile (pip, the driver). While this script works it holds a marker file that the watchdog
# counts as activity for at most tfcluster-boot-grace-minutes (default 45), so a slow first boot
# is not stopped and a hung one does not bill forever. A failure leaves the watchdog running.
set -uo pipefail

TF_VERSION="2.21.0"
ROOT=/opt/tfcluster
VENV="$ROOT/venv"
MARKER=/run/tfcluster/booting
# What the venv gets ($1: "" or "[and-cuda]"); .ci/vm-cache.sh builds the tests' offline
# wheelhouse from this same function.
requirements() {
  echo "tensorflow$1==$TF_VERSION" "tf-keras==$TF_VERSION" "tensorboard==$TF_VERSION" \
    "keras-tuner>=1.4.7,<1.5" pillow numpy google-cloud-storage
}
MD=http://metadata.google.internal/computeMetadata/v1

md() { curl -fsS -H 'Metadata-Flavor: Google' "$MD/$1"; }
NONCE=$(md instance/attributes/tfcluster-boot-nonce 2>/dev/null || true)
ready() { curl -fsS -X PUT -H 'Metadata-Flavor: Google' --data "$NONCE:$1" "$MD/instance/guest-attributes/tfcluster/ready" >/dev/null; }
fail() { echo "tfcluster startup: $*" >&2; ready "error: $*"; exit 1; }

mkdir -p "$ROOT" /run/tfcluster
touch "$MARKER"
trap 'rm -f "$MARKER"' EXIT
ready "starting"

# 0. The SSH host keys, on every boot, as the guest agent publishes them at an instance's first
# boot only (guest attributes hostkeys/<type>; guest-agent instance_setup.go). Google does not
# say guest attributes survive a stop, and `invoke up` pins a restarted VM's key from them. The
# guest agent's unit runs before this script's (google-startup-scripts.service), so these are
# the keys sshd serves.
for pub in /etc/ssh/ssh_host_*_key.pub; do
  [ -f "$pub" ] || continue
  read -r key_type key _ <"$pub"
  curl -fsS -X PUT -H 'Metadata-Flavor: Google' --data "$key" "$MD/instance/guest-attributes/hostkeys/$key_type" \
    >/dev/null || echo "tfcluster startup: could not publish the $key_type host key" >&2
done

# 1. The idle watchdog, delivered through metadata, restarted by systemd if it ever exits.
# The value is the package as JSON, {"file.py": source} (terraform/main.tf watchdog_package).
md instance/attributes/tfcluster-watchdog > "$ROOT/watchdog.json" || fail "metadata tfcluster-watchdog is missing"
rm -rf "$ROOT/tfcluster_watchdog.new"
python3 - "$ROOT/watchdog.json" "$ROOT/tfcluster_watchdog.new" <<'PY' || fail "python3 could not unpack the idle watchdog from metadata tfcluster-watchdog"
import json, pathlib, sys
files, folder = json.loads(pathlib.Path(sys.argv[1]).read_text()), pathlib.Path(sys.argv[2])
assert "__main__.py" in files and all("/" not in name for name in files)
folder.mkdir()
for name, source in files.items():
    (folder / name).write_text(source)
PY
rm -rf "$ROOT/tfcluster_watchdog" && mv "$ROOT/tfcluster_watchdog.new" "$ROOT/tfcluster_watchdog"
cat > /etc/systemd/system/tfcluster-watchdog.service <<UNIT
[Unit]
Description=tfcluster idle watchdog (stops or deletes this VM when idle)
After=network-online.target
Wants=network-online.target

[Service]
ExecStart=/usr/bin/python3 $ROOT/tfcluster_watchdog --gce --state-dir /var/lib/tfcluster --boot-marker $MARKER
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload || fail "systemctl daemon-reload failed"
systemctl enable tfcluster-watchdog.service >/dev/null 2>&1
systemctl restart tfcluster-watchdog.service || fail "the idle watchdog did not start"

# The image's python3 first: TensorFlow $TF_VERSION has wheels for Python 3.10 and newer only
# (tests/test_vm_requirements.py resolves this list for 3.10, the default image's), so an older
# one would fail minutes later at pip with "No matching distribution".
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
  fail "the image's python3 is $(python3 -V 2>&1 || echo missing); TensorFlow $TF_VERSION needs Python 3.10 or newer: choose an image with a newer python3 (variable image)"

# 2. Python environment with a pinned TensorFlow build (once per version). The image's system
# Python may lack venv (Ubuntu ships it as python3-venv): install it, waiting for the apt lock
# that the image's own first-boot jobs may hold, and try once more.
# One line from a tool's multi-line error: its first sentence, which says what went wrong.
summary() {
  local text
  text=$(tr -s ' \n\t' ' ' <<<"$1")
  text=${text# }
  text=${text% }
  [[ "$text" == *". "* ]] && text="${text%%. *}."
  printf '%s' "$text"
}
APT_LOG=/var/log/tfcluster-apt.log
# The image's own first-boot jobs (unattended-upgrades) may hold the dpkg lock: apt itself waits
# up to 10 minutes for it (DPkg::Lock::Timeout, apt.conf(5); apt >= 1.9.11, Ubuntu 20.04 on), then
# fails with "Could not get lock ... It is held by process N", which apt_error reports.
APT_WAIT=(-o DPkg::Lock::Timeout=600)
apt_install() {
  { DEBIAN_FRONTEND=noninteractive apt-get "${APT_WAIT[@]}" install -y -q "$@" ||
    { apt-get "${APT_WAIT[@]}" update -q && DEBIAN_FRONTEND=noninteractive apt-get "${APT_WAIT[@]}" install -y -q "$@"; }; } >>"$APT_LOG" 2>&1
}
# apt's last error or warning line (the log keeps the rest).
apt_error() { grep -E '^(E|W): ' "$APT_LOG" | tail -n 1 | tr -s ' \t' ' '; }
# 2a. A container runtime, when the cluster runs workers in an image (`train --image`; Terraform
# sets tfcluster-docker from variable `docker`). Docker from the distribution (docker.io on
# Ubuntu and Debian), unless the image has it already. The login that `train` uses must reach the
# daemon: the guest agent puts accounts it creates into the `docker` group by default
# (GoogleCloudPlatform/guest-agent README, Configuration: Accounts groups = adm,dip,docker,...),
# and one it created before the group existed is added here.
if [ "$(md instance/attributes/tfcluster-docker 2>/dev/null)" = "true" ]; then
  if ! command -v docker >/dev/null 2>&1; then
    apt_install docker.io || fail "Docker could not be installed (apt-get install docker.io): $(apt_error)"
  fi
  if ! systemctl enable --now docker.service >/dev/null 2>&1; then
    # dockerd's own reason ("failed to start daemon: ..."), not systemd's "Failed to start".
    why=$(journalctl -u docker.service -o cat --no-pager 2>/dev/null | grep -E '^failed to start daemon' | tail -n 1)
    fail "Docker is installed but its daemon did not start: $(summary "${why:-see journalctl -u docker.service}")"
  fi
  login=$(md instance/attributes/ssh-keys 2>/dev/null | head -n 1 | cut -d: -f1)
  if [ -n "$login" ] && id "$login" >/dev/null 2>&1; then
    usermod -aG docker "$login" || fail "could not add $login to the docker group"
  fi
  # GPUs inside containers: the NVIDIA Container Toolkit, configured as a Docker runtime
  # (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html:
  # NVIDIA's apt repository and key, apt-get install nvidia-container-toolkit, then
  # `nvidia-ctk runtime configure --runtime=docker` and a daemon restart).
  if [ "$(md instance/attributes/install-nvidia-driver 2>/dev/null)" = "True" ] && ! command -v nvidia-ctk >/dev/null 2>&1; then
    keyring=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
    { curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey | gpg --dearmor --yes -o "$keyring" &&
      curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list |
        sed "s#deb https://#deb [signed-by=$keyring] https://#g" >/etc/apt/sources.list.d/nvidia-container-toolkit.list &&
      apt-get update -q >>"$APT_LOG" 2>&1; } || fail "NVIDIA's container toolkit repository could not be added (no route to nvidia.github.io?)"
    apt_install nvidia-container-toolkit || fail "the NVIDIA container toolkit could not be installed: $(apt_error)"
  fi
  if [ "$(md instance/attributes/install-nvidia-driver 2>/dev/null)" = "True" ]; then
    { nvidia-ctk runtime configure --runtime=docker >/dev/null && systemctl restart docker.service; } ||
      fail "Docker could not be given the NVIDIA runtime (nvidia-ctk runtime configure --runtime=docker)"
  fi
fi

stamp="$VENV/.installed-tensorflow-$TF_VERSION-tuner"
if [ ! -f "$stamp" ]; then
  if ! venv_error=$(python3 -m venv "$VENV" 2>&1); then
    rm -rf "$VENV"
    apt_install python3-venv ||
      fail "python3 -m venv failed: $(summary "$venv_error") Installing python3-venv failed: $(apt_error)"
    venv_error=$(python3 -m venv "$VENV" 2>&1) || fail "python3 -m venv failed: $(summary "$venv_error")"
  fi
  extra=""
  [ "$(md instance/attributes/install-nvidia-driver 2>/dev/null)" = "True" ] && extra="[and-cuda]"
  "$VENV/bin/pip" install -q --upgrade pip || fail "pip upgrade failed (no route to PyPI?)"
  read -ra packages <<<"$(requirements "$extra")"
  "$VENV/bin/pip" install -q "${packages[@]}" || fail "pip install tensorflow$extra==$TF_VERSION failed"
  touch "$stamp"
fi
chmod -R a+rX "$ROOT"

# 3. The driver and GPU are visible (the image installs the driver on first boot).
if [ "$(md instance/attributes/install-nvidia-driver 2>/dev/null)" = "True" ]; then
  deadline=$((SECONDS + 900))
  until nvidia-smi -L >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || fail "nvidia-smi finds no GPU after 15 minutes: the NVIDIA driver did not load"
    sleep 10
  done
  "$VENV/bin/python" -c 'import sys, tensorflow as tf; sys.exit(0 if tf.config.list_physical_devices("GPU") else 1)' \
    || fail "TensorFlow $TF_VERSION sees no GPU although nvidia-smi does (CUDA libraries?)"
fi

ready "ok"
