"""terraform/ and the product agree, checked by the real terraform binary (with the provider
stand-ins, tests/world/provider): the tfvars the product writes name exactly the module's
variables, terraform has no warning about them, and every numeric setting is accepted or refused
alike by tfcluster/config.py and by the module's validation rules at its boundaries."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.test_terraform import TF
from tests.world.provider import mirror, planning
from tests.world.provider.planning import terraform
from tfcluster import config
from tfcluster.backends.gcp.backend import GcpBackend
from tfcluster.errors import ConfigError

GCP = {"backend": "gcp", "project": "demo-project", "zone": "us-west1-b", "operator_cidr": "203.0.113.7/32"}
# Variables variables() leaves out: `up` adds the exact boot image that `invoke check` resolved
# (tfcluster/backends/gcp/backend.py, _create).
MODULE_DEFAULTS = {"image"}


def declared() -> dict[str, str]:
    """Each variable of terraform/variables.tf with its block's text."""
    text = (TF / "variables.tf").read_text()
    return {block.split('"')[1]: block for block in re.split(r"\nvariable ", "\n" + text)[1:]}


def product_variables(**settings) -> dict:
    values = config.load({**GCP, **settings})
    return GcpBackend(None).variables(values, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample tfcluster-default",
                                      values.operator_cidr)


# One worker runs the module in file order on its module-scoped world (tests/scheduling.py).
pytestmark = pytest.mark.xdist_group("terraform_agreement")


@pytest.fixture(scope="module")
def terraform_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("providers")
    import os

    return {**os.environ, **mirror.build(root)}


def test_the_tfvars_keys_are_the_module_variables():
    variables = declared()
    required = {name for name, block in variables.items() if "default" not in block}
    keys = set(product_variables())
    assert keys - set(variables) == set(), "the product writes variables terraform/ does not declare"
    assert required <= keys
    assert keys == set(variables) - MODULE_DEFAULTS


def test_terraform_plans_the_products_tfvars_without_a_warning(tmp_path, terraform_env):
    workdir = tmp_path / "cluster"
    shutil.copytree(TF, workdir)
    (workdir / "terraform.tfvars.json").write_text(json.dumps(product_variables()))
    assert terraform(terraform_env, workdir, "init", "-input=false").returncode == 0
    plan = terraform(terraform_env, workdir, "plan", "-input=false", "-refresh=false")
    output = plan.stdout + plan.stderr
    assert plan.returncode == 0, output
    assert "undeclared variable" not in output and "Warning:" not in output, output


def numeric_rules() -> dict[str, tuple[int, int, bool]]:
    """Variables validated as `var.x >= MIN && var.x <= MAX` that are also product settings, and
    whether the rule also reads another variable."""
    settings = set(config.DEFAULTS)
    rules = {}
    for name, block in declared().items():
        match = re.search(rf"condition\s*=\s*var\.{name} >= (-?\d+) && var\.{name} <= (-?\d+)(.*)", block)
        if match and name in settings:
            rules[name] = (int(match[1]), int(match[2]), bool(re.search(r"var\.(?!" + name + r"\b)", match[3])))
    return rules


def refused_by_terraform(env, root, modules: dict, command: str) -> set[str]:
    """The module calls (one per case) whose variables terraform refuses."""
    root.mkdir()
    shutil.copytree(TF, root / "module")
    (root / "main.tf.json").write_text(json.dumps({"module": modules}))
    assert terraform(env, root, "init", "-input=false").returncode == 0
    checked = terraform(env, root, *command.split())
    refused = set(re.findall(r'in module(?:\.| ")(\w+)', checked.stdout + checked.stderr))
    assert refused or checked.returncode == 0, checked.stdout + checked.stderr
    return refused


def test_numeric_settings_agree_with_the_module_at_their_boundaries(tmp_path, terraform_env):
    rules = numeric_rules()
    assert {"workers", "boot_disk_gb", "tf_port", "oracle_port", "idle_minutes", "max_run_hours"} <= set(rules)
    base = product_variables()
    # `terraform validate` evaluates a rule on one variable; one that reads another (oracle_port
    # != tf_port) only `plan` evaluates (each case then starts its own providers, so only those).
    cases = {"validate": {}, "plan -input=false -refresh=false": {}}
    product_accepts = {}
    for name, (low, high, reads_others) in rules.items():
        for value in (low - 1, low, high, high + 1):
            case = f"{name}_{value}".replace("-", "minus")
            try:
                config.load({**GCP, name: value})
                product_accepts[case] = True
            except ConfigError:
                product_accepts[case] = False
            command = "plan -input=false -refresh=false" if reads_others else "validate"
            cases[command][case] = {"source": "./module", **base, name: value}
    refused = set()
    for index, (command, modules) in enumerate(cases.items()):
        refused |= refused_by_terraform(terraform_env, tmp_path / f"root{index}", modules, command)
    disagree = {case: f"config.py {'accepts' if ok else 'refuses'}, terraform "
                      f"{'refuses' if case in refused else 'accepts'}"
                for case, ok in product_accepts.items() if ok == (case in refused)}
    assert disagree == {}
    assert refused  # The values beyond each range were refused.


def planned_bucket(env, workdir: Path, variables: dict) -> dict:
    """google_storage_bucket.cluster as `terraform plan` would create it from ``variables``."""
    return planning.planned_values(planning.plan(env, workdir, variables), "google_storage_bucket.cluster")


def test_the_bucket_deletes_no_live_object_unless_asked(tmp_path, terraform_env):
    """Only replaced versions are deleted by default (a day after); deleting results by age is the
    user's choice, bucket_retention_days, which the product writes."""
    rules = planned_bucket(terraform_env, tmp_path / "default", product_variables())["lifecycle_rule"]
    assert [rule["condition"][0].get("days_since_noncurrent_time") for rule in rules] == [1]
    assert [rule["condition"][0].get("with_state") for rule in rules] == ["ARCHIVED"]
    asked = planned_bucket(terraform_env, tmp_path / "asked", product_variables(bucket_retention_days=30))
    ages = sorted(rule["condition"][0].get("age") or 0 for rule in asked["lifecycle_rule"])
    assert ages == [0, 30]


def test_the_modules_gpu_table_is_generated_from_tfcluster_gpus():
    """terraform/machine_types.json is tfcluster/gpus.py's table, as `python -m tfcluster.gpus` writes it."""
    from tfcluster import gpus

    assert json.loads((TF / "machine_types.json").read_text()) == gpus.terraform_table(), \
        "stale: run python -m tfcluster.gpus > terraform/machine_types.json"


# (machine_type, gpu_type, gpu_count, boot_disk_type, nic_type, spot): each family's rule at work,
# accepted and refused (tfcluster/gpus.py; the module reads the same table).
GPU_CASES = {
    "n1_t4": ("n1-standard-8", "nvidia-tesla-t4", 1, "pd-balanced", "", False),
    "n1_v100_16": ("n1-standard-8", "nvidia-tesla-v100", 16, "pd-balanced", "", False),
    "n1_l4": ("n1-standard-8", "nvidia-l4", 1, "pd-balanced", "", False),
    "g2_l4_2": ("g2-standard-24", "nvidia-l4", 2, "pd-ssd", "", False),
    "g2_l4_count": ("g2-standard-24", "nvidia-l4", 1, "pd-balanced", "", False),
    "g2_pd_standard": ("g2-standard-8", "nvidia-l4", 1, "pd-standard", "", False),
    "a2_a100": ("a2-highgpu-1g", "nvidia-tesla-a100", 1, "pd-standard", "", False),
    "a2_a100_16": ("a2-megagpu-16g", "nvidia-tesla-a100", 16, "pd-balanced", "", False),
    "a2_wrong_gpu": ("a2-highgpu-1g", "nvidia-l4", 1, "pd-balanced", "", False),
    "a2_ultra": ("a2-ultragpu-8g", "nvidia-a100-80gb", 8, "pd-balanced", "", False),
    "a3_h100": ("a3-highgpu-8g", "nvidia-h100-80gb", 8, "pd-balanced", "GVNIC", False),
    "a3_virtio": ("a3-highgpu-8g", "nvidia-h100-80gb", 8, "pd-balanced", "VIRTIO_NET", False),
    "a3_spot_only": ("a3-highgpu-2g", "nvidia-h100-80gb", 2, "pd-balanced", "", False),
    "a3_spot": ("a3-highgpu-2g", "nvidia-h100-80gb", 2, "pd-ssd", "", True),
    "a3_pd_standard": ("a3-highgpu-8g", "nvidia-h100-80gb", 8, "pd-standard", "", False),
}


def test_gpu_and_machine_family_rules_agree_with_the_module(tmp_path, terraform_env):
    base = product_variables()
    product_accepts, modules = {}, {}
    for case, (machine, gpu, count, disk, nic, spot) in GPU_CASES.items():
        try:
            config.load({**GCP, "machine_type": machine, "gpu": gpu, "gpu_count": count, "boot_disk_type": disk,
                         "nic_type": nic, "spot": spot})
            product_accepts[case] = True
        except ConfigError:
            product_accepts[case] = False
        modules[case] = {"source": "./module", **base, "machine_type": machine, "gpu_type": gpu, "gpu_count": count,
                         "boot_disk_type": disk, "nic_type": nic, "spot": spot}
    # The rules read other variables and the table: only `plan` evaluates them.
    refused = refused_by_terraform(terraform_env, tmp_path / "root", modules, "plan -input=false -refresh=false")
    disagree = {case: f"config.py {'accepts' if ok else 'refuses'}, terraform "
                      f"{'refuses' if case in refused else 'accepts'}"
                for case, ok in product_accepts.items() if ok == (case in refused)}
    assert disagree == {}
    assert sorted(refused) == sorted(case for case, ok in product_accepts.items() if not ok)
    assert {"n1_l4", "g2_pd_standard", "a3_virtio", "a3_spot_only", "a2_wrong_gpu"} <= refused
