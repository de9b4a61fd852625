"""Config and argument errors: one line naming the key and valid values, non-zero exit."""

import pytest
from invoke import Config, Exit, MockContext

from tfcluster import cli as tasks  # The tasks (tasks.py re-exports them for `invoke`).
from tfcluster import config
from tfcluster.errors import ConfigError


def test_defaults_and_precedence():
    settings = config.load({"workers": 2, "cluster": "exp"}, workers=4)
    assert (settings.workers, settings.cluster, settings.backend) == (4, "exp", "local")
    assert config.load({"workers": "5"}).workers == 5  # env vars arrive as strings


@pytest.mark.parametrize("overrides, message", [
    ({"workers": 0}, "workers must be >= 1 (got 0)"),
    ({"workers": -2}, "workers must be >= 1 (got -2)"),
    ({"workers": "three"}, "workers must be a whole number >= 1 (got 'three')"),
    ({"backend": "kubernetes"}, "backend must be one of local, ssh, gcp (got 'kubernetes')"),
    ({"cluster": "Bad Name"}, "cluster must be lowercase letters"),
    ({"retries": -1}, "retries must be >= 0 (got -1)"),
    ({"stop_grace_seconds": 0}, "stop_grace_seconds must be a number in (0, 300]"),
    ({"keras": "legacy"}, "keras must be one of 2, 3 (got 'legacy'); set it in invoke.yaml (tfcluster.keras)"),
    ({"keras": 4}, "keras must be one of 2, 3 (got 4)"),
    ({"boot_grace_minutes": 0}, "boot_grace_minutes must be >= 1 (got 0)"),
    ({"boot_grace_minutes": 2000}, "boot_grace_minutes must be between 1 and 1440 (got 2000)"),
])
def test_bad_values_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as error:
        config.load({}, **overrides)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_keras_defaults_to_2_and_reads_yaml_numbers():
    assert config.load({}).keras == "2"
    assert config.load({"keras": 3}).keras == "3"  # `keras: 3` in invoke.yaml is a YAML int.


def test_unknown_yaml_key_lists_valid_keys():
    with pytest.raises(ConfigError, match="unknown setting tfcluster.wokers; valid keys: .*workers"):
        config.load({"wokers": 3})


def _context(tmp_path, **values) -> MockContext:
    overrides = {"tfcluster": {**config.DEFAULTS, "state_dir": str(tmp_path), **values}}
    return MockContext(config=Config(overrides=overrides))


def test_task_turns_config_error_into_exit(tmp_path):
    with pytest.raises(Exit) as exit_info:
        tasks.up(_context(tmp_path), workers="0")
    assert exit_info.value.code == 2
    assert str(exit_info.value.message).startswith("error: workers must be >= 1")


def test_train_needs_a_cluster_first(tmp_path):
    with pytest.raises(Exit, match="no cluster 'default' is up; run: invoke up"):
        tasks.train(_context(tmp_path))


def test_more_workers_than_the_cluster_has(tmp_path):
    context = _context(tmp_path, workers=3)
    tasks.up(context)
    with pytest.raises(Exit, match=r"workers must be between 1 and 3.*got 4"):
        tasks.train(context, workers="4")


def test_missing_script(tmp_path):
    context = _context(tmp_path, workers=1)
    tasks.up(context)
    with pytest.raises(Exit, match="--script .*nope.py does not exist"):
        tasks.train(context, script=str(tmp_path / "nope.py"))


def test_up_is_idempotent_and_refuses_a_silent_resize(tmp_path):
    context = _context(tmp_path, workers=2)
    tasks.up(context)
    state_file = tmp_path / "clusters" / "default.json"
    before = state_file.read_text()
    tasks.up(context)
    assert state_file.read_text() == before
    with pytest.raises(Exit, match="already up with 2 local workers; run `invoke down` first"):
        tasks.up(context, workers="3")


def test_dry_run_prints_every_tf_config_and_starts_nothing(tmp_path, capsys):
    context = _context(tmp_path, workers=3)
    tasks.up(context)
    context.remainder = "--epochs 2"
    tasks.train(context, dry_run=True)
    out = capsys.readouterr().out
    assert out.count("TF_CONFIG:") == 3
    assert '"type": "worker", "index": 1' in out
    assert "trainer.task --epochs 2" in out
    assert not (tmp_path / "runs").exists()


def test_cli_error_is_one_line_without_traceback(cli):
    result = cli.run("up", "--workers", "0")
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: workers must be >= 1 (got 0); set it in invoke.yaml "
                                     "(tfcluster.workers), INVOKE_TFCLUSTER_WORKERS or --workers")
    assert "Traceback" not in result.stdout + result.stderr


def test_env_var_reaches_the_typed_config(cli):
    cli.env["INVOKE_TFCLUSTER_BACKEND"] = "nosuch"
    result = cli.run("up")
    assert result.returncode == 2
    assert "backend must be one of local, ssh, gcp (got 'nosuch')" in result.stderr


def test_trainer_rejects_bad_arguments(synthetic_data, capsys):
    from trainer import task

    with pytest.raises(SystemExit) as exit_info:
        task.parse_args(["--data-dir", str(synthetic_data), "--epochs", "0"])
    assert exit_info.value.code == 2
    assert "--epochs: must be >= 1 (got 0)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        task.parse_args(["--data-dir", str(synthetic_data), "--model", "vgg"])
    assert "invalid choice: 'vgg' (choose from 'cnn', 'densenet121', 'resnet50')" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        task.parse_args(["--data-dir", "/nonexistent"])
    assert "has no manifest.json" in capsys.readouterr().err


@pytest.mark.parametrize("overrides, message", [
    ({"cluster": "ab"}, "cluster must be 3 to 21 characters on gcp"),
    ({"cluster": "a" * 22}, "cluster must be 3 to 21 characters on gcp"),
    ({"cluster": "exp-"}, "not ending with a dash (got 'exp-')"),
    ({"gpu": "t4", "gpu_count": 8}, "gpu_count must be one of 1, 2, 4 for nvidia-tesla-t4 on N1 (got 8)"),
    ({"gpu": "v100", "gpu_count": 1, "machine_type": "n1-standard-16"},
     "machine_type n1-standard-16 (16 vCPUs, 60 GB) is too large for 1 x nvidia-tesla-v100: Google allows "
     "at most 12 vCPUs and 78 GB"),
    ({"gpu": "t4", "gpu_count": 1, "machine_type": "n1-highmem-64"}, "at most 48 vCPUs and 312 GB"),
    # G2, A2 and A3 (tfcluster/gpus.py): the GPUs come with the machine type.
    ({"gpu": "a200"}, "gpu must be one of t4, v100, l4, a100, a100-80gb, h100 (got 'a200')"),
    ({"gpu": "l4", "gpu_count": 3}, "gpu_count must be one of 1, 2, 4, 8 for l4 on G2 (got 3)"),
    ({"gpu": "a100", "gpu_count": 0}, "gpu_count must be one of 1, 2, 4, 8, 16 for a100 on A2 (got 0)"),
    ({"gpu": "l4", "machine_type": "n1-standard-8"},
     "machine_type n1-standard-8 does not come with l4 GPUs: l4 runs on G2 (g2-standard-8, g2-standard-4, "),
    ({"gpu": "t4", "machine_type": "g2-standard-8"}, "machine_type must be an N1 type such as n1-standard-8"),
    ({"gpu": "l4", "gpu_count": 1, "machine_type": "g2-standard-24"},
     "machine_type g2-standard-24 has 2 x l4, not gpu_count 1; leave machine_type empty to pick g2-standard-8"),
    ({"gpu": "h100", "gpu_count": 1},
     "machine_type a3-highgpu-1g is offered only as Spot: add --spot, or use a3-highgpu-8g"),
    ({"gpu": "l4", "boot_disk_type": "pd-standard"}, "boot_disk_type must be one of pd-balanced, pd-ssd on G2 "
                                                     "(got 'pd-standard')"),
    ({"gpu": "h100", "gpu_count": 8, "boot_disk_type": "pd-standard"}, "boot_disk_type must be one of pd-balanced, "
                                                                        "pd-ssd on A3"),
    ({"gpu": "t4", "boot_disk_type": "hyperdisk-balanced"}, "boot_disk_type must be one of pd-standard, "
                                                            "pd-balanced, pd-ssd on N1"),
    ({"gpu": "h100", "gpu_count": 8, "nic_type": "virtio_net"}, "nic_type must be GVNIC on A3 (got VIRTIO_NET); "
                                                                "leave nic_type empty to have it"),
    ({"nic_type": "e1000"}, "nic_type must be one of VIRTIO_NET, GVNIC or empty (got 'E1000')"),
])
def test_gcp_refuses_what_google_would_refuse(overrides, message):
    with pytest.raises(ConfigError) as error:
        config.load({"backend": "gcp"}, **overrides)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_gcp_accepts_the_shapes_google_offers():
    assert config.load({"backend": "gcp", "cluster": "exp", "machine_type": "n1-standard-8"}).gpu_count == 1
    assert config.load({"backend": "gcp", "gpu": "v100", "gpu_count": 8, "machine_type": "n1-highmem-96"})
    assert config.load({"backend": "local", "cluster": "x"}).cluster == "x"  # Other backends keep the old rule.
    # An empty machine_type is picked from the GPU and gpu_count (tfcluster/gpus.py).
    picked = {(gpu, count): config.load({"backend": "gcp", "gpu": gpu, "gpu_count": count, "spot": True}).machine_type
              for gpu, count in [("t4", 1), ("l4", 1), ("l4", 2), ("a100", 1), ("a100", 16), ("a100-80gb", 8),
                                 ("h100", 1), ("h100", 8)]}
    assert picked == {("t4", 1): "n1-standard-8", ("l4", 1): "g2-standard-8", ("l4", 2): "g2-standard-24",
                      ("a100", 1): "a2-highgpu-1g", ("a100", 16): "a2-megagpu-16g",
                      ("a100-80gb", 8): "a2-ultragpu-8g", ("h100", 1): "a3-highgpu-1g", ("h100", 8): "a3-highgpu-8g"}
    assert config.load({"backend": "gcp", "gpu": "nvidia-l4"}).gpu == "l4"  # The accelerator name works too.
    assert config.load({"backend": "gcp", "gpu": "h100", "gpu_count": 8, "nic_type": "gvnic"}).nic_type == "GVNIC"


def test_gcp_cluster_name_rule_matches_the_terraform_module():
    from tests.test_terraform import parse

    block = next(v["cluster_name"] for v in parse("variables.tf")["variable"] if "cluster_name" in v)
    assert f'regex("{config.GCP_CLUSTER_NAME}", var.cluster_name)' in block["validation"][0]["condition"]
