#!/usr/bin/env bash
# Regenerates the hash-pinned locks in requirements/ (run by hand, then commit the result and run
# .ci/run): the product with its test and gcp extras (and the setuptools the editable install builds with),
# checkov and mkdocs in their own venvs, and what startup/startup.sh installs on a VM (for the booted-VM
# tests' wheelhouse). pyproject.toml keeps ranges; only these files pin.
#   bash .ci/lock.sh            resolve the newest versions the ranges allow
#   bash .ci/lock.sh --upgrade-package NAME   move one package, keep the rest
set -euo pipefail
cd "$(dirname "$0")/.."
tools=${TFCLUSTER_LOCK_VENV:-/tmp/tfcluster-lock-venv}
[ -x "$tools/bin/uv" ] || { python3 -m venv "$tools" && "$tools/bin/pip" install -q uv; }
target=(--generate-hashes --python-platform x86_64-unknown-linux-gnu -q "$@")

# The VM's list is the boot script's own requirements() (CPU form) plus pip, which it upgrades.
(
  # shellcheck disable=SC1090
  source <(sed -n -e '/^TF_VERSION=/p' -e '/^requirements() {/,/^}/p' startup/startup.sh)
  requirements "" | tr ' ' '\n'
  echo pip
) >requirements/vm.in

"$tools/bin/uv" pip compile pyproject.toml requirements/build.in --extra test --extra gcp --python-version 3.11 \
  "${target[@]}" -o requirements/test.lock
"$tools/bin/uv" pip compile requirements/checkov.in --python-version 3.11 "${target[@]}" -o requirements/checkov.lock
# Debian 12's python3 is 3.11 (the booted-VM image); the default Deep Learning VM image runs 3.10.
"$tools/bin/uv" pip compile requirements/vm.in --python-version 3.11 "${target[@]}" -o requirements/vm.lock
# The --image tests' training image (tests/imagelab.py): Debian 12's python3 too.
"$tools/bin/uv" pip compile requirements/image.in --python-version 3.11 "${target[@]}" -o requirements/image.lock
# The terraform provider stand-ins' own venv (tests/world/provider/mirror.py): tf 1.2.0 pins
# protobuf < 6, which the product's google-cloud-compute cannot share.
"$tools/bin/uv" pip compile requirements/provider.in --python-version 3.11 "${target[@]}" -o requirements/provider.lock
# The documentation site (mkdocs.yml, docs/), built in CI in its own venv (.venv-docs).
"$tools/bin/uv" pip compile requirements/docs.in --python-version 3.11 "${target[@]}" -o requirements/docs.lock
echo "locks written: $(ls requirements/*.lock | tr '\n' ' ')"
