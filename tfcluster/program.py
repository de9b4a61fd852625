"""The `tfcluster` console program: the tasks of tfcluster/cli.py from any folder, as invoke's own
``Program``, and invoke's errors while it reads its config files (before any task runs) as one
`error:` line. tasks.py installs the same handling for `invoke` in a clone (``excepthook``).

A command line invoke's parser refuses (an unknown flag or task, a flag without its value) is one
`error:` line with the fix and exit 2 (tfcluster/slips.py), for both commands: ``hint_slips`` wraps
invoke's parsing steps, on TfclusterProgram here and on invoke's own Program from tasks.py.

May import: tfcluster.cli (the tasks), tfcluster.slips, tfcluster.spoken and invoke; nothing below the tasks.
"""

from __future__ import annotations

import inspect
import os
import re
import sys

from invoke import Exit, Program
from invoke.config import AmbiguousMergeError
from invoke.exceptions import ParseError, UncastableEnvVar, UnknownFileType
from invoke.util import yaml as invoke_yaml

import tfcluster
from tfcluster import slips, spoken
from tfcluster.cli import ns, take_environment



def config_file_error(error: BaseException) -> str | None:
    """invoke's own errors while it reads its config files, before any task runs, as one line
    (None: not one of them). ``invoke.util.yaml`` is the YAML module invoke reads them with."""
    if isinstance(error, invoke_yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        return (f"{mark.name} is not valid YAML: {error.problem} at line {mark.line + 1}, column {mark.column + 1}; "
                "fix it (settings go under `tfcluster:`, one `key: value` a line, indented by spaces)")
    if isinstance(error, invoke_yaml.YAMLError):
        return f"invoke.yaml is not valid YAML ({error}); fix it"
    if isinstance(error, AmbiguousMergeError):  # A mapping where the other config file has a value.
        return (f"invoke's config files disagree on a setting's kind ({error}); tfcluster must be a mapping "
                "of settings, and each setting a single value (zones: a list), in invoke.yaml and ~/.invoke.yaml")
    if isinstance(error, (UnknownFileType, UncastableEnvVar)):
        return f"{error}"
    return None


def excepthook(kind, error, trace) -> None:
    """For `invoke` from a clone (tasks.py installs it): invoke reads invoke.yaml after it has loaded
    the tasks and before any runs, outside any task's reach; its errors there become one line."""
    if isinstance(error, BrokenPipeError):  # `invoke --list | head`: the reader went away.
        os._exit(141)
    line = config_file_error(error)
    if line is None:
        sys.__excepthook__(kind, error, trace)
        return
    print(f"error: {line}", file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(2)  # The exit code of every other configuration error (an excepthook's return exits 1).


def _explained(step):
    """invoke's parsing ``step`` with its ParseError said as one `error:` line (exit 2)."""

    def explained(self, *args, **kwargs):
        core = getattr(self, "core", None)
        if step.__name__ == "parse_tasks" and core is not None:
            core.unparsed[:] = slips.default_positionals(list(core.unparsed))
        try:
            return step(self, *args, **kwargs)
        except ParseError as error:
            parser = getattr(self, "parser", None)
            contexts = dict(parser.contexts) if parser is not None else {}
            core = getattr(self, "core", None)
            unparsed = list(core.unparsed) if core is not None else []
            remainder = core.remainder if core is not None else ""
            raise Exit(f"error: {slips.explain(error, contexts, unparsed, remainder)}", code=2) from None

    explained.slips_hinted = True
    return explained


def hint_slips(program_class: type[Program]) -> None:
    """Wrap ``program_class``'s task parsing and its `--help TASK` check (once)."""
    for name in ("parse_tasks", "parse_cleanup"):
        step = getattr(program_class, name)
        if not getattr(step, "slips_hinted", False):
            setattr(program_class, name, _explained(step))


# What a flag's value is, by its parameter's annotation (invoke says STRING for every flag whose
# default is None) or, for text, by its name.
_PATH_FLAGS = ("script", "code_dir", "requirements", "ssh_key", "known_hosts", "src", "out", "dockerfile", "context")


def _metavar(parameter: inspect.Parameter | None) -> str:
    if parameter is None:
        return "VALUE"
    annotation = str(parameter.annotation)
    if "int" in annotation:
        return "N"
    return "PATH" if parameter.name in _PATH_FLAGS else "VALUE"


class TfclusterProgram(Program):
    """`tfcluster`: the tasks of tfcluster/cli.py from any folder. Settings come as they do for `invoke` (its
    system and user files, INVOKE_TFCLUSTER_* and flags), and the project file is the invoke.yaml
    of the folder the command runs in, when there is one. `tfcluster --help` lists the tasks (invoke's
    own core options, such as --pty or --echo, do nothing for them), and a task's help names what each
    option takes."""

    def print_help(self) -> None:
        print(f"Usage: {self.binary} TASK [--options] [-- ARGS for the trainer or script]\n")
        print("Take a TensorFlow training program to a cluster (this machine, your hosts, Google Cloud VMs or "
              "Vertex AI) and back, leaving nothing billing.\n")
        print("Tasks:")
        self.print_columns([(name, spoken.respell((inspect.getdoc(task.body) or "").split("\n")[0]))
                            for name, task in self.collection.tasks.items()])
        print(f"`{self.binary} --help TASK` explains a task and its options; `{self.binary} --version` says the "
              "version. Settings: invoke.yaml (tfcluster:), INVOKE_TFCLUSTER_*, or the flags.")

    def print_task_help(self, name: str) -> None:
        task = self.collection[name]
        parameters = inspect.signature(task.body).parameters
        passes = " [-- ARGS]" if name in slips.PASSES_ARGS else ""
        print(f"Usage: {self.binary} {name} [--options]{passes}\n")
        print("\n".join("  " + spoken.respell(line) for line in (inspect.getdoc(task.body) or "").splitlines()) + "\n")
        print("Options:")
        tuples = []
        for spec, text in self.parser.contexts[name].help_tuples():
            long = re.search(r"--(?:\[no-\])?([\w-]+)", spec)
            kind = _metavar(parameters.get(long.group(1).replace("-", "_")) if long else None)
            tuples.append((re.sub(r"\b(STRING|INT)\b", kind, spec), text))
        if tuples:
            self.print_columns(tuples)
        else:
            print("  none\n")

    def create_config(self) -> None:
        super().create_config()
        self.config.set_project_location(os.getcwd())
        self.config.load_project()

    def run(self, argv=None, exit: bool = True) -> None:  # noqa: A002 (invoke's own name)
        try:
            super().run(argv, exit)
        except BrokenPipeError:  # `tfcluster --list | head`: the reader went away.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(141)
        except Exception as error:  # Only the config files' errors; anything else is raised as it is.
            line = config_file_error(error)
            if line is None:
                raise
            print(f"error: {line}", file=sys.stderr)
            if not exit:
                return
            sys.exit(2)


hint_slips(TfclusterProgram)


def main() -> None:
    """The `tfcluster` console script (pyproject.toml [project.scripts])."""
    take_environment()
    spoken.set_program("tfcluster")
    hint_slips(TfclusterProgram)
    TfclusterProgram(namespace=ns, version=tfcluster.__version__, name="tfcluster", binary="tfcluster",
             binary_names=["tfcluster"]).run()

