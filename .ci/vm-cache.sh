#!/usr/bin/env bash
# Caches for the booted-VM tests (tests/vmlab.py, tests/test_vm_boot.py), built once from the
# package registries and reused: idempotent, each part keyed on its inputs so a changed list
# rebuilds only that part. Needs root, debootstrap, docker and a Python with pip (the first
# `python3` on PATH: .ci/run calls it with the venv active).
#   rootfs-KEY.tar + image tfcluster-test/vm:KEY  Debian 12 minbase with systemd, python3, curl,
#       ca-certificates, psmisc (fuser, as on Ubuntu) -- and NOT python3-venv, so the boot script's
#       fallback runs -- plus the unit that runs the metadata startup-script as Compute Engine does.
#   apt-KEY/     an offline apt repository (flat, Packages index) with python3-venv, docker.io and every
#       package it needs beyond the rootfs; the tests give it to a machine through its apt sources.
#   wheels-KEY/  the wheels startup/startup.sh installs (requirements/vm.lock: its requirements()
#       list, resolved and hash-pinned), served to a machine as pip's find-links through /etc/pip.conf.
# Prints one JSON line with the timings and writes current.env, which tests/vmlab.py reads.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${TFCLUSTER_CI_CACHE:-/var/cache/tfcluster-ci}/vm"
MIRROR=http://deb.debian.org/debian
DEBS=systemd,systemd-sysv,dbus,python3,curl,ca-certificates,psmisc
APT_PACKAGES=(python3-venv docker.io)
mkdir -p "$CACHE"
# One builder at a time: every clone on the machine shares this cache (held until exit).
exec 9>"$CACHE/.lock"
flock 9
key() { printf '%s\n' "$@" | sha256sum | cut -c1-12; }
now() { date +%s.%N; }
took() { python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$1" "$(now)"; }
timings=()

# The boot unit, as the guest agent ships it (GoogleCloudPlatform/guest-agent,
# google-startup-scripts.service): a oneshot after network-online, KillMode=process, no start
# timeout. Its runner fetches the startup-script attribute from the metadata server and runs it
# (google_metadata_script_runner does the same through a temp file), so the machine runs exactly
# what Terraform puts there: file(startup/startup.sh).
read -r -d '' UNIT <<'EOF' || true
[Unit]
Description=Google Compute Engine Startup Scripts (stand-in runner)
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
ExecStart=/usr/local/bin/tfcluster-test-startup-runner
KillMode=process
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
EOF
read -r -d '' RUNNER <<'EOF' || true
#!/bin/bash
set -euo pipefail
script=$(mktemp /run/startup-script.XXXXXX)
curl -fsS --retry 5 --retry-connrefused -H 'Metadata-Flavor: Google' \
  http://metadata.google.internal/computeMetadata/v1/instance/attributes/startup-script -o "$script"
exec /bin/bash "$script"
EOF

# ---- 1. root filesystem and image
ROOTFS_KEY=$(key "$MIRROR" "$DEBS" "$UNIT" "$RUNNER" v1)
IMAGE="tfcluster-test/vm:$ROOTFS_KEY"
ROOTFS_TAR="$CACHE/rootfs-$ROOTFS_KEY.tar"
if [ ! -f "$ROOTFS_TAR" ]; then
  t=$(now)
  work=$(mktemp -d "$CACHE/build.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  debootstrap --variant=minbase --include="$DEBS" bookworm "$work/root" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
  root="$work/root"
  # The machine's package sources are world configuration (the tests mount them): none built in.
  rm -rf "$root/var/lib/apt/lists" "$root/var/cache/apt/archives" "$root/etc/apt/sources.list"
  mkdir -p "$root/var/lib/apt/lists/partial" "$root/var/cache/apt/archives/partial"
  printf '%s\n' "$UNIT" >"$root/etc/systemd/system/google-startup-scripts.service"
  ln -sf /etc/systemd/system/google-startup-scripts.service \
    "$root/etc/systemd/system/multi-user.target.wants/google-startup-scripts.service"
  printf '%s\n' "$RUNNER" >"$root/usr/local/bin/tfcluster-test-startup-runner"
  chmod 755 "$root/usr/local/bin/tfcluster-test-startup-runner"
  : >"$root/etc/machine-id"
  tar --numeric-owner -C "$root" -cf "$ROOTFS_TAR.tmp" .
  mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
  rm -rf "$work"; trap - EXIT
  timings+=("\"rootfs\": $(took "$t")")
fi
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  t=$(now)
  docker import --change 'CMD ["/sbin/init"]' "$ROOTFS_TAR" "$IMAGE" >/dev/null
  timings+=("\"docker import\": $(took "$t")")
fi

# ---- 2. offline apt repository, resolved against the rootfs itself (same suite and versions)
APT_KEY=$(key "$ROOTFS_KEY" "${APT_PACKAGES[@]}" v1)
APT_REPO="$CACHE/apt-$APT_KEY"
if [ ! -f "$APT_REPO/Packages" ]; then
  t=$(now)
  work=$(mktemp -d "$CACHE/build.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  root="$work/root"
  mkdir "$root"
  tar --numeric-owner -C "$root" -xf "$ROOTFS_TAR"
  echo "deb $MIRROR bookworm main" >"$root/etc/apt/sources.list"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  chroot "$root" apt-get update -qq >/dev/null
  chroot "$root" apt-get install -y -qq --download-only --no-install-recommends "${APT_PACKAGES[@]}" >/dev/null
  mkdir -p "$work/repo"
  mv "$root"/var/cache/apt/archives/*.deb "$work/repo/"
  (cd "$work/repo" && dpkg-scanpackages --multiversion . /dev/null >Packages 2>/dev/null)
  rm -rf "$APT_REPO"
  mv "$work/repo" "$APT_REPO"
  rm -rf "$work"; trap - EXIT
  timings+=("\"apt repo\": $(took "$t")")
fi

# ---- 3. wheelhouse: exactly what the boot script installs (its requirements() list, resolved and
# hash-pinned in requirements/vm.lock, which tests/test_locks.py keeps equal to the script's list),
# for Debian 12's Python (this machine's platform tags: Debian 12 too). Keyed on the resolved
# versions, so a warm cache never freezes older ones than a fresh machine would get.
LOCK=requirements/vm.lock
PYTHON_VERSION=3.11  # Debian 12's python3.
WHEELS_KEY=$(key "$(cat "$LOCK")" "$PYTHON_VERSION" v2)
WHEELS="$CACHE/wheels-$WHEELS_KEY"
if [ ! -f "$WHEELS/.complete" ]; then
  t=$(now)
  rm -rf "$WHEELS.tmp"
  PIP_CACHE_DIR="$CACHE/pip-cache" python3 -m pip download -q --dest "$WHEELS.tmp" --only-binary=:all: \
    --python-version "$PYTHON_VERSION" --no-deps --require-hashes -r "$LOCK" >"$CACHE/pip-download.log" 2>&1 \
    || { grep -v 'is ignored' "$CACHE/pip-download.log" | tail -n 20 >&2; exit 1; }
  touch "$WHEELS.tmp/.complete"
  rm -rf "$WHEELS"
  mv "$WHEELS.tmp" "$WHEELS"
  timings+=("\"wheelhouse\": $(took "$t")")
fi

cat >"$CACHE/current.env.tmp" <<EOF
IMAGE=$IMAGE
ROOTFS_TAR=$ROOTFS_TAR
ROOTFS_KEY=$ROOTFS_KEY
APT_REPO=$APT_REPO
WHEELHOUSE=$WHEELS
EOF
mv "$CACHE/current.env.tmp" "$CACHE/current.env"
old_ifs=$IFS; IFS=,
echo "{\"image\": \"$IMAGE\", \"steps\": {${timings[*]}}}"
IFS=$old_ifs
