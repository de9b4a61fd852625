"""A filesystem mirror that installs the provider stand-ins into the real terraform binary.

Terraform's CLI configuration (TF_CLI_CONFIG_FILE) names the mirror, so the product's own
`terraform init` installs them, checks versions.tf's constraints and writes the lock file
(developer.hashicorp.com/terraform/cli/config/config-file#filesystem_mirror). `dev_overrides`
would make a plain `init` fail offline.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PROVIDERS = {"google": ("7.46.1", "tests.world.provider.google_provider"),
             "random": ("3.9.1", "tests.world.provider.random_provider")}
TERRAFORM = "/usr/local/bin/terraform"
# The plugins' own interpreter. `tf` 1.2.0 pins protobuf < 6 while google-cloud-compute needs
# >= 6.33.5, so pip cannot install both in one environment (ResolutionImpossible): the providers
# run from a virtualenv of their own (requirements/provider.lock, hash-pinned), made once per
# machine, keyed on the lock, built under a lock of its own (suites share the cache).
LOCK = REPO / "requirements" / "provider.lock"


def provider_python() -> str:
    cache = Path(os.environ.get("TFCLUSTER_CI_CACHE") or Path.home() / ".cache" / "tfcluster")
    cache.mkdir(parents=True, exist_ok=True)
    stamp = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]
    venv = cache / f"provider-venv-{stamp}"
    python = venv / "bin" / "python"
    with open(cache / ".provider-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / ".complete").exists():
            subprocess.run(["python3", "-m", "venv", "--clear", str(venv)], check=True, capture_output=True)
            # From PyPI itself: not through the world's CA, which a test's environment may trust.
            env = {k: v for k, v in os.environ.items()
                   if k not in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "PIP_CERT")}
            pip = subprocess.run([str(python), "-m", "pip", "install", "-q", "--require-hashes", "-r", str(LOCK)],
                                 capture_output=True, text=True, env=env)
            if pip.returncode != 0:
                raise RuntimeError(f"installing {LOCK.name} into {venv} failed: {pip.stderr[-2000:]}")
            (venv / ".complete").write_text("")
    return str(python)


def build(root: Path) -> dict[str, str]:
    """Write the mirror and CLI configuration under ``root``; returns the environment terraform needs."""
    mirror = root / "mirror"
    for name, (version, module) in PROVIDERS.items():
        folder = mirror / "registry.terraform.io" / "hashicorp" / name / version / "linux_amd64"
        folder.mkdir(parents=True, exist_ok=True)
        plugin = folder / f"terraform-provider-{name}_v{version}"
        plugin.write_text(f"#!{provider_python()}\nimport sys\nsys.path.insert(0, {str(REPO)!r})\n"
                          f"from {module} import main\nmain()\n")
        plugin.chmod(0o755)
    config = root / "cli.tfrc"
    config.write_text('provider_installation {\n  filesystem_mirror {\n'
                      f'    path    = "{mirror}"\n    include = ["registry.terraform.io/hashicorp/*"]\n  }}\n}}\n')
    return {"TF_CLI_CONFIG_FILE": str(config), "CHECKPOINT_DISABLE": "1", "TFCLUSTER_TERRAFORM": TERRAFORM}


if __name__ == "__main__":  # .ci/run builds it before the tests: `python -m tests.world.provider.mirror`
    print(provider_python())
