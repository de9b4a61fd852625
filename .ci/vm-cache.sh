#!/usr/bin/env bash
# Caches for the booted-VM tests (tests/vmlab.py, tests/test_vm_boot.py), built once from the
# package registries and reused: idempotent, each part keyed on its inputs so a changed list
# rebuilds only that part. Needs root, debootstrap, docker and a Python with pip (the first
# `python3` on PATH: .ci/run calls it with the venv active).
#   rootfs-KEY.tar + image tfcluster-test/vm:KEY  Debian 12 minbase with systemd, python3, curl,
#       ca-certificates, psmisc (fuser, as on Ubuntu), openssh-server (a Deep Learning VM image has
#       sshd) -- and NOT python3-venv, so the boot script's fallback runs -- plus the unit that runs
#       the metadata startup-script as Compute Engine does, and a guest-agent stand-in.
#   apt-KEY/     an offline apt repository (flat, Packages index) with python3-venv, docker.io and every
#       package it needs beyond the rootfs; the tests give it to a machine through its apt sources.
#   wheels-KEY/  the wheels startup/startup.sh installs (requirements/vm.lock: its requirements()
#       list, resolved and hash-pinned), served to a machine as pip's find-links through /etc/pip.conf.
# Prints one JSON line with the timings and writes current.env, which tests/vmlab.py reads.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${TFCLUSTER_CI_CACHE:-/var/cache/tfcluster-ci}/vm"
MIRROR=http://deb.debian.org/debian
DEBS=systemd,systemd-sysv,dbus,python3,curl,ca-certificates,psmisc,openssh-server
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

# The guest agent's part that tfcluster relies on (GoogleCloudPlatform/guest-agent README,
# "Instance Setup" and "Account management"; google_guest_agent/instance_setup.go): at the first
# boot of an instance (its instance/id differs from the one the agent recorded) it generates new
# SSH host keys and writes each public key to the guest attribute hostkeys/<type>, so two VMs from
# one image never share keys; later boots of the same instance keep them and write nothing. On
# every boot it creates the account of each `user:key` line of the instance's ssh-keys metadata
# and writes the key into that account's authorized_keys (the real agent also keeps watching the
# metadata; tfcluster sets ssh-keys only at creation), in the groups the agent uses by default
# that exist here (adm, dip, docker, video, plugdev).
read -r -d '' AGENT_UNIT <<'EOF' || true
[Unit]
Description=Google guest agent (stand-in: host keys, accounts)
Wants=network-online.target
After=network-online.target
Before=ssh.service google-startup-scripts.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/bin/tfcluster-test-guest-agent

[Install]
WantedBy=multi-user.target
EOF
read -r -d '' AGENT <<'EOF' || true
#!/bin/bash
set -uo pipefail
MD=http://metadata.google.internal/computeMetadata/v1
md() { curl -fsS --retry 30 --retry-all-errors --retry-delay 1 -H 'Metadata-Flavor: Google' "$MD/$1"; }
id=$(md instance/id) || { echo "guest agent: no metadata server" >&2; exit 1; }
if [ "$id" != "$(cat /etc/default/instance_id 2>/dev/null)" ]; then
  rm -f /etc/ssh/ssh_host_*
  ssh-keygen -A
  for pub in /etc/ssh/ssh_host_*_key.pub; do
    read -r type key _ <"$pub"
    curl -fsS -X PUT -H 'Metadata-Flavor: Google' --data "$key" "$MD/instance/guest-attributes/hostkeys/$type" >/dev/null ||
      echo "guest agent: could not write hostkeys/$type" >&2
  done
  echo "$id" >/etc/default/instance_id
fi
md instance/attributes/ssh-keys 2>/dev/null | while IFS= read -r line || [ -n "$line" ]; do
  user=${line%%:*} key=${line#*:}
  [ -n "$user" ] && [ "$user" != "$line" ] || continue
  if ! id "$user" >/dev/null 2>&1; then
    groups=$(for g in adm dip docker video plugdev; do getent group "$g" >/dev/null && printf '%s,' "$g"; done)
    useradd -m -s /bin/bash ${groups:+-G "${groups%,}"} "$user"
  fi
  home=$(getent passwd "$user" | cut -d: -f6)
  install -d -m 700 -o "$user" -g "$user" "$home/.ssh"
  printf '%s\n' "$key" >"$home/.ssh/authorized_keys"
  chown "$user:$user" "$home/.ssh/authorized_keys"
  chmod 600 "$home/.ssh/authorized_keys"
done
EOF

# ---- 1. root filesystem and image
ROOTFS_KEY=$(key "$MIRROR" "$DEBS" "$UNIT" "$RUNNER" "$AGENT_UNIT" "$AGENT" v2)
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
  printf '%s\n' "$AGENT_UNIT" >"$root/etc/systemd/system/google-guest-agent.service"
  ln -sf /etc/systemd/system/google-guest-agent.service \
    "$root/etc/systemd/system/multi-user.target.wants/google-guest-agent.service"
  printf '%s\n' "$AGENT" >"$root/usr/local/bin/tfcluster-test-guest-agent"
  chmod 755 "$root/usr/local/bin/tfcluster-test-guest-agent"
  # The host keys made when openssh-server was installed are the image's, as on a real image: the
  # guest agent replaces them at each instance's first boot. pam_loginuid cannot write
  # /proc/self/loginuid without CAP_AUDIT_CONTROL, which an unprivileged container lacks (a VM has
  # it): there it would refuse every login session.
  sed -i 's/^session\s\+required\s\+pam_loginuid.so/session optional pam_loginuid.so/' "$root/etc/pam.d/sshd"
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
  download() {
    rm -rf "$WHEELS.tmp"
    PIP_CACHE_DIR="$CACHE/pip-cache" python3 -m pip download -q --dest "$WHEELS.tmp" --only-binary=:all: \
      --python-version "$PYTHON_VERSION" --no-deps --require-hashes -r "$LOCK" >"$CACHE/pip-download.log" 2>&1
  }
  # A failed download on a fresh machine (seen 2026-11-25 on two machines, twice in a row on the
  # second, gone on the next try: the wheels fetched so far stay in pip's cache) is tried again, up
  # to three tries, each failure's log tail shown; the third failure stops the build with the log.
  for try in 1 2 3; do
    download && break
    grep -v 'is ignored' "$CACHE/pip-download.log" | tail -n 20 >&2
    [ "$try" -lt 3 ] || exit 1
    echo "vm-cache: pip download failed (try $try of 3); trying again" >&2
    sleep 5
  done
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
