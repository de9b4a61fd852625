"""The terraform CLI on a cluster's own working directory, and its typed outputs.

``TFCLUSTER_TERRAFORM`` may name the binary (default: terraform on PATH).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tfcluster.backends.gcp.cloud.errors import terraform_error_line
from tfcluster.errors import ClusterError, ConfigError, TfClusterError
from tfcluster.state import write_json

MODULE_DIR = Path(__file__).resolve().parents[4] / "terraform"


class TerraformError(TfClusterError):
    """terraform failed; keeps its stderr, shows the Google fix or the first error line."""

    def __init__(self, action: str, stderr: str, project: str = ""):
        self.stderr = stderr
        lines = [line.strip(" │╷╵") for line in stderr.splitlines()]
        errors = [line for line in lines if line.startswith("Error:")]
        summary = errors[0] if errors else next((line for line in reversed(lines) if line), "no output")
        fix = terraform_error_line(stderr, project or "PROJECT")
        if fix:
            super().__init__(f"terraform {action}: {fix} (full output in the cluster's terraform.log)")
        else:
            super().__init__(f"terraform {action} failed: {summary} (full output in the cluster's terraform.log); "
                             "fix it and re-run the same command: it resumes, or `invoke down` removes what exists")


class Terraform:
    """The terraform CLI on one working directory: argument lists, -chdir, -input=false."""

    def __init__(self, workdir: Path, binary: str | None = None, project: str = "",
                 announce: Callable[[str], None] = lambda line: None):
        self.workdir = workdir
        # Where mend() says what it mended.
        self.announce = announce
        # Names the project in the fixes for Google errors found in terraform's output.
        self.project = project
        self.binary = binary or os.environ.get("TFCLUSTER_TERRAFORM") or shutil.which("terraform")
        if not self.binary or not os.access(self.binary, os.X_OK):
            raise ConfigError("terraform is not installed; install Terraform >= 1.9, the module's required_version "
                              "(https://developer.hashicorp.com/terraform/install) or set TFCLUSTER_TERRAFORM")

    def run(self, action: str, *args: str) -> str:
        argv = [self.binary, f"-chdir={self.workdir}", action, *args]
        env = {**os.environ, "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1"}
        result = subprocess.run(argv, capture_output=True, text=True, env=env)
        with open(self.workdir / "terraform.log", "a") as log:
            log.write(f"$ {' '.join(argv)}\n{result.stdout}\n{result.stderr}\n")
        if result.returncode != 0:
            raise TerraformError(action, result.stderr, self.project)
        return result.stdout

    def mend(self) -> None:
        """What a killed terraform left in the folder (tfcluster/backends/gcp/cloud/terraform_remains.py), mended
        before this one runs; an error while a terraform of the cluster still runs."""
        from tfcluster.backends.gcp.cloud.terraform_remains import mend_folder

        if self.workdir.is_dir():
            for line in mend_folder(self.workdir, self.workdir.name):
                self.announce(line)

    def prepare(self, variables: dict) -> None:
        """Copy the module into the cluster's own folder (its own state), write the tfvars, init."""
        self.mend()
        self.workdir.mkdir(parents=True, exist_ok=True)
        for source in [*MODULE_DIR.glob("*.tf"), MODULE_DIR / "machine_types.json"]:
            shutil.copyfile(source, self.workdir / source.name)
        write_json(self.workdir / "terraform.tfvars.json", variables)  # Atomic: a kill leaves the old or the new.
        self.run("init", "-input=false", "-no-color")

    def apply(self, targets: list[str] | None = None) -> None:
        """Apply the module, or only ``targets`` (resource addresses): a later change must never
        touch what it does not name (a max_run_duration change would stop running VMs)."""
        self.run("apply", "-input=false", "-auto-approve", "-no-color", *[f"-target={t}" for t in targets or []])

    def set_variables(self, changes: dict) -> None:
        path = self.workdir / "terraform.tfvars.json"
        variables = json.loads(path.read_text())
        variables.update(changes)
        write_json(path, variables)

    def variables(self) -> dict:
        return json.loads((self.workdir / "terraform.tfvars.json").read_text())

    def forget(self, address: str) -> None:
        """Drop a resource from the state so that destroy leaves it alone (it keeps existing)."""
        self.run("state", "rm", "-no-color", address)

    def destroy(self, targets: list[str] | None = None) -> None:
        self.run("destroy", "-input=false", "-auto-approve", "-no-color", *(f"-target={t}" for t in targets or []))

    def outputs(self) -> "TerraformOutputs":
        return TerraformOutputs.parse(json.loads(self.run("output", "-json", "-no-color") or "{}"))


@dataclass
class GcpInstance:
    # VM name, e.g. demo-0 (index 0 is the chief).
    name: str
    # Zone, e.g. us-west1-b.
    zone: str
    # Address the other workers use (TF_CONFIG).
    internal_ip: str
    # Address the laptop uses for SSH.
    external_ip: str


@dataclass
class TerraformOutputs:
    # VMs in worker order.
    instances: list[GcpInstance]
    # Cluster bucket name.
    bucket: str
    # Each VM's own service account email, in worker order (terraform/iam.tf: one per VM).
    service_accounts: list[str]
    # Labels on every VM.
    labels: dict[str, str]
    # The cluster's Artifact Registry path, LOCATION-docker.pkg.dev/PROJECT/REPO ("" if none).
    registry: str = ""

    @classmethod
    def parse(cls, raw: dict) -> "TerraformOutputs":
        """From `terraform output -json`: {"name": {"value": ..., "type": ..., "sensitive": ...}}."""
        try:
            value = {name: item["value"] for name, item in raw.items()}
            instances = [GcpInstance(name=vm["name"], zone=vm["zone"].rsplit("/", 1)[-1],
                                     internal_ip=vm["internal_ip"], external_ip=vm["external_ip"])
                         for vm in value["instances"]]
            return cls(instances, value["bucket"], list(value["service_accounts"]), dict(value.get("labels", {})),
                       str(value.get("registry", "")))
        except (KeyError, TypeError) as error:
            raise ClusterError(f"terraform outputs are incomplete ({error}); run `invoke up` again") from None
