"""No traceback on any input: every setting given a value of the wrong kind through each source
(invoke.yaml, INVOKE_TFCLUSTER_*, a flag) is one `error:` line naming the key; every number flag of
every task given a word is one line too; and the issue's five tracebacks, each from a real CLI:
a variable, broken YAML, a read-only state folder on `up` and on `down`, `tensorboard --port abc`."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Config

from tests.conftest import REPO
from tfcluster import cli, config
from tfcluster.errors import ConfigError

FIELDS = {item.name: item.default for item in dataclasses.fields(config.Settings)}


def wrong_values(key: str) -> dict[str, list]:
    """Per source, values of a kind the setting does not take. A variable and a flag carry text, so a
    setting that is text has none there (any text is text; each key's own rule checks its form)."""
    default = FIELDS[key]
    if key == "zones":
        return {"yaml": [{"a": 1}, [1, 2], True], "env": [], "flag": []}
    if isinstance(default, bool):
        return {"yaml": ["maybe", [True], {"a": 1}], "env": ["maybe"], "flag": []}  # A yes/no flag takes no value.
    if isinstance(default, (int, float)):
        return {"yaml": ["abc", [1], {"a": 1}, True], "env": ["abc", "1e99x", ""], "flag": ["abc"]}
    return {"yaml": [[1, 2], {"a": 1}, True], "env": [], "flag": []}


def yaml_values(tmp_path: Path, key: str, value) -> dict:
    """What invoke gives the tasks from an invoke.yaml holding ``key: value`` under tfcluster."""
    from invoke.util import yaml  # The YAML module invoke reads its files with.

    (tmp_path / "invoke.yaml").write_text(yaml.safe_dump({"tfcluster": {key: value}}))
    loaded = Config(project_location=str(tmp_path))
    loaded.load_project()
    return dict(loaded.get("tfcluster", {}))


@pytest.mark.parametrize("key", sorted(FIELDS))
def test_every_setting_refuses_a_wrong_kind_from_each_source_in_one_line(key, tmp_path):
    values = wrong_values(key)
    cases = [("invoke.yaml", lambda v: config.load(yaml_values(tmp_path, key, v)), v) for v in values["yaml"]]
    cases += [(f"INVOKE_TFCLUSTER_{key.upper()}",
               lambda v: config.load(config.take_environment({f"INVOKE_TFCLUSTER_{key.upper()}": v})), v)
              for v in values["env"]]
    cases += [(f"--{key.replace('_', '-')}", lambda v: config.load({}, **{key: v}), v) for v in values["flag"]]
    for source, load, value in cases:
        if value == "" and source.startswith("INVOKE_"):
            continue  # An empty variable: see below.
        with pytest.raises(ConfigError) as refused:
            load(value)
        line = str(refused.value)
        assert "\n" not in line and key in line, (source, value, line)
    if "" in values["env"]:  # An empty number variable is refused too, or is the default; never a traceback.
        try:
            config.load(config.take_environment({f"INVOKE_TFCLUSTER_{key.upper()}": ""}))
        except ConfigError as error:
            assert key in str(error)


def number_flags() -> list[tuple[str, str]]:
    """(task, flag) for every flag of every task that takes a value, but free text."""
    text = {"cluster", "project", "script", "run", "resume", "src", "out", "tag", "context", "registry", "dockerfile",
            "hosts", "ssh-user", "ssh-key", "known-hosts", "python", "operator-cidr", "image", "action",
            "machine-type", "zone"}
    return [(name, argument.names[0]) for name, task in sorted(cli.ns.tasks.items())
            for argument in task.get_arguments() if argument.kind is not bool and argument.names[0] not in text]


@pytest.mark.parametrize("task,flag", number_flags())
def test_every_flag_given_a_word_is_one_line_through_the_real_parser(task, flag, tmp_path, capsys, monkeypatch):
    """In process, through invoke's own parser and the installed command's Program: a word where a
    number or a choice goes ends the command with one `error:` line, before anything is created."""
    monkeypatch.chdir(tmp_path)  # No invoke.yaml: the defaults, and the suite's own state folder.
    program = cli._Program(namespace=cli.ns, name="tfcluster", binary="tfcluster")
    argv = ["tfcluster", task, *(["build"] if task == "image" else []), f"--{flag}", "abc"]
    with pytest.raises(SystemExit) as ended:
        program.run(argv)
    out, err = capsys.readouterr()
    assert ended.value.code != 0 and err.count("error:") == 1 and err.startswith("error: "), (argv, out, err)
    assert "Traceback" not in out + err and not list(config.user_state_dir().glob("clusters/*.json"))


@pytest.mark.parametrize("argv,line", [
    (["up", "--hosts", "a,b"], "error: --hosts needs --backend ssh, and the backend is local; add the backend, or drop it"),
    (["up", "--gpu", "l4", "--spot"], "error: --gpu, --spot need --backend gcp, and the backend is local; add the backend, "
                                      "or drop them"),
    (["up", "--backend", "ssh", "--hosts", "a", "--zone", "us-west1-b"],
     "error: --zone needs --backend gcp, and the backend is ssh; add the backend, or drop it"),
    (["check", "--spot"], "error: --spot needs --backend gcp, and the backend is local; add the backend, or drop it"),
])
def test_a_flag_of_another_backend_is_refused_not_ignored(argv, line, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        cli._Program(namespace=cli.ns, name="tfcluster", binary="tfcluster").run(["tfcluster", *argv])
    assert ended.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [line]
    assert not list(config.user_state_dir().glob("clusters/*.json"))  # Nothing made.


# ---------------------------------------------------------------- the five, from a real CLI


def invoke_in(folder: Path, *args: str, env: dict | None = None, prefix: tuple = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "invoke", *args], cwd=folder, capture_output=True,
                          text=True, timeout=120, env={**(env or {}), "PYTHONPATH": str(REPO), "COLUMNS": "200",
                                                       "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})


def assert_one_line(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_a_variable_broken_yaml_a_read_only_state_folder_and_a_port_are_one_line_each(tmp_path):
    clone = tmp_path / "clone"
    clone.mkdir()
    for name in ("tasks.py", "invoke.yaml"):  # invoke.yaml says `workers: 3`: invoke would cast to int.
        shutil.copy(REPO / name, clone / name)
    state = tmp_path / "state"
    env = {"INVOKE_TFCLUSTER_STATE_DIR": str(state), "HOME": str(tmp_path)}

    assert_one_line(invoke_in(clone, "status", env={**env, "INVOKE_TFCLUSTER_WORKERS": "abc"}),
                    "workers must be a whole number", "INVOKE_TFCLUSTER_WORKERS")
    assert_one_line(invoke_in(clone, "tensorboard", "--port", "abc", env=env), "port must be a whole number")

    assert invoke_in(clone, "up", "--workers", "1", env=env).returncode == 0
    read_only = ("unshare", "--mount", "--", "sh", "-c", f'mount -o bind,ro {state} {state} && exec "$@"', "sh")
    for command in (["up", "--workers", "1", "--cluster", "more"], ["down"]):
        assert_one_line(invoke_in(clone, *command, env=env, prefix=read_only), f"cannot use {state}",
                        "Read-only file system", "INVOKE_TFCLUSTER_STATE_DIR")
    assert (state / "clusters" / "default.json").exists()  # down kept the record: it can be run again.
    assert invoke_in(clone, "down", env=env).returncode == 0

    (clone / "invoke.yaml").write_text("tfcluster:\n  workers: [3\n")
    assert_one_line(invoke_in(clone, "status", env=env), f"{clone / 'invoke.yaml'} is not valid YAML",
                    "at line 3, column 1")


@pytest.mark.parametrize("name", sorted(cli.ns.tasks))
def test_dash_h_is_help_on_every_task(name, capsys):
    """`-h` shows the task's help, never a flag's short name (it was `--then` on train)."""
    try:
        cli._Program(namespace=cli.ns, name="tfcluster", binary="tfcluster").run(["tfcluster", name, "-h"])
        code = 0  # `image`: its positional action took the flag, and it printed its help.
    except SystemExit as ended:
        code = ended.code
    out, err = capsys.readouterr()
    usage = "Usage: image build --tag" if name == "image" else f"Usage: tfcluster [--core-opts] {name} "
    assert code == 0 and usage in out, out + err
