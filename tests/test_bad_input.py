"""No traceback on any input: every setting given a value of the wrong kind through each source
(invoke.yaml, INVOKE_TFCLUSTER_*, a flag) is one `error:` line naming the key; every number flag of
every task given a word is one line too; and the issue's five tracebacks, each from a real CLI:
a variable, broken YAML, a read-only state folder on `up` and on `down`, `tensorboard --port abc`."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Config

from tests.conftest import REPO
from tfcluster import cli, config, program, spoken
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
    tfcluster_program = program.TfclusterProgram(namespace=cli.ns, name="tfcluster", binary="tfcluster")
    argv = ["tfcluster", task, *(["build"] if task == "image" else []), f"--{flag}", "abc"]
    with pytest.raises(SystemExit) as ended:
        tfcluster_program.run(argv)
    out, err = capsys.readouterr()
    assert ended.value.code != 0 and err.count("error:") == 1 and err.startswith("error: "), (argv, out, err)
    assert "Traceback" not in out + err and not list(config.user_state_dir().glob("clusters/*.json"))


@pytest.mark.parametrize("argv,line", [
    (["up", "--hosts", "a,b"], "error: --hosts needs --backend ssh, and the backend is local; add the backend, or drop it"),
    (["up", "--gpu", "l4", "--spot"], "error: --gpu, --spot need --backend gcp or --backend vertex, and the backend is "
                                      "local; add the backend, or drop them"),
    (["up", "--backend", "ssh", "--hosts", "a", "--zone", "us-west1-b"],
     "error: --zone needs --backend gcp or --backend vertex, and the backend is ssh; add the backend, or drop it"),
    (["check", "--spot"], "error: --spot needs --backend gcp or --backend vertex, and the backend is local; add the "
                          "backend, or drop it"),
    (["up", "--backend", "gcp", "--project", "p", "--zone", "us-west1-b", "--region", "us-west1"],
     "error: --region needs --backend vertex, and the backend is gcp; add the backend, or drop it"),
])
def test_a_flag_of_another_backend_is_refused_not_ignored(argv, line, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        program.TfclusterProgram(namespace=cli.ns, name="tfcluster", binary="tfcluster").run(["tfcluster", *argv])
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
    # An `up` killed or failed leaves its record "provisioning": train starts nothing there (issue 46).
    record = state / "clusters" / "default.json"
    finished = record.read_text()
    record.write_text(json.dumps({**json.loads(finished), "status": "provisioning"}))
    assert_one_line(invoke_in(clone, "train", "--detach", env=env), "cluster 'default' is not up",
                    "run `invoke up` again to finish it, or `invoke down`")
    record.write_text(finished)
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
        program.TfclusterProgram(namespace=cli.ns, name="tfcluster", binary="tfcluster").run(["tfcluster", name, "-h"])
        code = 0  # `image`: its positional action took the flag, and it printed its help.
    except SystemExit as ended:
        code = ended.code
    out, err = capsys.readouterr()
    usage = "Usage: image build --tag" if name == "image" else f"Usage: tfcluster {name} [--options]"
    assert code == 0 and usage in out, out + err


# ---------------------------------------------------------------- issue 47: slips get the fix, said with the program's name


def run_tfcluster(argv: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """The installed command's own entry point (program.main), in process."""
    monkeypatch.setattr(spoken, "PROGRAM", spoken.PROGRAM)  # main() sets it; put it back after.
    # main() takes INVOKE_TFCLUSTER_* out of the environment into cli's own dict, once per process: a
    # fresh one here, so no later test in this process reads this test's state folder.
    monkeypatch.setattr(cli, "_ENVIRONMENT", {})
    monkeypatch.setattr(sys, "argv", ["tfcluster", *argv])
    try:
        program.main()
        code = 0
    except SystemExit as ended:
        code = ended.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv,line", [
    (["train", "--epochs", "5"], "error: trainer and script flags go after `--`: tfcluster train -- --epochs 5"),
    (["train", "--script", "x.py", "--epochs", "2", "--workers", "2"],
     "error: trainer and script flags go after `--`: tfcluster train --script x.py --workers 2 -- --epochs 2"),
    (["train", "--script", "x.py", "--epochs", "2", "--", "--lr", "0.1"],
     "error: trainer and script flags go after `--`: tfcluster train --script x.py -- --epochs 2 --lr 0.1"),
    (["tune", "--dropout", "0.3"],
     "error: the search's and script's flags go after `--`: tfcluster tune -- --dropout 0.3"),
    (["train", "--worker", "2"],
     "error: train has no --worker; did you mean --workers? (`tfcluster --help train` lists its options)"),
    (["train", "--wrokers", "2"],
     "error: train has no --wrokers; did you mean --workers? (`tfcluster --help train` lists its options)"),
    (["trian"], "error: no task 'trian'; did you mean train? `tfcluster --list` lists them"),
    (["--help", "trian"], "error: no task 'trian'; did you mean train? `tfcluster --list` lists them"),
    (["costs", "--cluster", "x"], "error: costs takes no options (it covers every cluster); see `tfcluster --help costs`"),
    (["train", "--workers"], "error: --workers needs a value; see `tfcluster --help train`"),
    (["tensorboard", "--port", "abc"],
     "error: port must be a whole number >= 1 (got 'abc'); set it in --port (a flag of this task, not a setting)"),
    (["train", "--project", "my-gcp-proj"], "error: train takes no --project: the Google Cloud project is the "
     "cluster's (`tfcluster up --project P`), and a folder shipped with --script is --code-dir: tfcluster train "
     "--script SCRIPT --code-dir my-gcp-proj"),
    (["tune", "--script", "s.py", "--project", "src"], "error: tune takes no --project: the Google Cloud project is "
     "the cluster's (`tfcluster up --project P`), and a folder shipped with --script is --code-dir: tfcluster tune "
     "--script SCRIPT --code-dir src"),
])
def test_a_slip_on_the_command_line_is_one_line_naming_the_fix(argv, line, tmp_path, capsys, monkeypatch):
    """Issue 47's two commonest slips: a trainer flag before `--`, and a typo of a flag or a task."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run_tfcluster(argv, monkeypatch, capsys)
    assert (code, err.strip().splitlines()) == (2, [line]), out + err


def test_hints_name_the_command_the_user_runs(tmp_path, capsys, monkeypatch):
    """`tfcluster` says `tfcluster up`; `invoke` in a clone still says `invoke up`, slips included."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("INVOKE_TFCLUSTER_STATE_DIR", str(tmp_path / "state"))
    code, _, err = run_tfcluster(["stop"], monkeypatch, capsys)
    assert code == 2 and err.strip() == "error: no cluster 'default' is up; run: tfcluster up", err
    text = spoken.respell("Follow it with `invoke logs --follow`; see invoke.yaml (INVOKE_TFCLUSTER_X), invoke's files")
    assert text == "Follow it with `tfcluster logs --follow`; see invoke.yaml (INVOKE_TFCLUSTER_X), invoke's files"
    env = {"INVOKE_TFCLUSTER_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path)}
    assert_one_line(invoke_in(REPO, "stop", env=env), "run: invoke up")
    assert_one_line(invoke_in(REPO, "train", "--epochs", "5", env=env), "go after `--`: invoke train -- --epochs 5")


def test_help_lists_the_tasks_and_each_task_names_what_its_options_take(capsys, monkeypatch):
    """`tfcluster --help` was invoke's: --prompt-for-sudo-password, --pty and --echo above the tasks, and
    every option typed STRING; the short flags were each task's first free letter (-a: --detach, --all, --raw)."""
    code, out, _ = run_tfcluster(["--help"], monkeypatch, capsys)
    assert code in (0, None) and out.startswith("Usage: tfcluster TASK [--options]"), out
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and not line.startswith("   ")]
    assert listed == list(cli.ns.tasks), out
    assert "--pty" not in out and "--prompt-for-sudo-password" not in out and "--echo" not in out
    assert "image         `tfcluster image build`" in out
    code, out, _ = run_tfcluster(["--help", "train"], monkeypatch, capsys)
    assert "STRING" not in out and "-w N, --workers=N" in out and "--script=PATH" in out, out
    shorts = {name: sorted(flag for argument in task.get_arguments() for flag in argument.names if len(flag) == 1)
              for name, task in cli.ns.tasks.items()}
    assert {flag for flags in shorts.values() for flag in flags} <= {"w", "c", "f"}, shorts


def test_a_tasks_own_flag_is_not_named_as_a_setting():
    """`logs --worker abc` named tfcluster.worker and INVOKE_TFCLUSTER_WORKER, which do not exist."""
    with pytest.raises(ConfigError) as refused:
        config.parse_int("worker", "abc", 0)
    assert str(refused.value).endswith("set it in --worker (a flag of this task, not a setting)")
    with pytest.raises(ConfigError) as refused:
        config.parse_int("workers", "abc", 1)
    assert "invoke.yaml (tfcluster.workers), INVOKE_TFCLUSTER_WORKERS or --workers" in str(refused.value)


# What a plain `pip install tfcluster` leaves out, made unimportable (pyproject.toml's gcp extra: the
# google-cloud-* clients and what only they bring: google-auth, google-api-core, proto-plus,
# googleapis-common-protos; not protobuf, grpcio nor google-crc32c, which TensorFlow or the core needs).
WITHOUT_GCP_EXTRA = """
import importlib.abc, sys
BLOCKED = ("google.cloud", "google.auth", "google.oauth2", "google.api_core", "google.rpc", "google.longrunning",
           "google.type", "proto", "googleapiclient")
class WithoutGcpExtra(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == top or name.startswith(top + ".") for top in BLOCKED):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, WithoutGcpExtra())
"""


def test_the_plain_install_runs_the_local_demo_and_a_gcp_command_names_the_extra(tmp_path):
    """Issue 47: the install pulled nine google-cloud libraries to try the local demo. They are the `gcp` extra
    now: without them the local cluster comes up and goes, and a gcp or vertex command says what to install."""
    import os
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert [d for d in project["dependencies"] if d.startswith("google-cloud")] == [], project["dependencies"]
    assert any(d.startswith("google-cloud-compute") for d in project["optional-dependencies"]["gcp"])
    (tmp_path / "block").mkdir()
    (tmp_path / "block" / "sitecustomize.py").write_text(WITHOUT_GCP_EXTRA)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "block"), "INVOKE_TFCLUSTER_STATE_DIR": str(tmp_path / "state"),
           "HOME": str(tmp_path)}

    def tfcluster(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(Path(sys.executable).parent / "tfcluster"), *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)

    blocked = tfcluster("offers", "--gpu", "t4", "--project", "p")  # The blocker holds: Google's libraries are gone.
    for args in (("up", "--workers", "1"), ("status",), ("down",)):
        done = tfcluster(*args)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (args, done.stdout, done.stderr)
    for args, missing in ((("up", "--backend", "gcp", "--project", "p", "--zone", "us-west1-b"), "google.cloud"),
                          (("up", "--backend", "vertex", "--project", "p", "--region", "us-west1"), "google.auth")):
        done = tfcluster(*args)
        assert (done.returncode, done.stderr.strip().splitlines()) == (2, [
            f"error: this needs Google Cloud's client libraries, which this install of tfcluster leaves out ({missing} "
            "is missing); install them with pip install 'tfcluster[gcp]' (the local and ssh backends need none)"]), args
    assert blocked.returncode == 2 and blocked.stderr.count("\n") == 1, blocked.stderr
    assert "tfcluster[gcp]" in blocked.stderr, blocked.stderr
