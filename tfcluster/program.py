"""The `tfcluster` console program: the tasks of tfcluster/cli.py from any folder, as invoke's own
``Program``, and invoke's errors while it reads its config files (before any task runs) as one
`error:` line. tasks.py installs the same handling for `invoke` in a clone (``excepthook``).

May import: tfcluster.cli (the tasks) and invoke; nothing below the tasks.
"""

from __future__ import annotations

import os
import sys

from invoke import Program
from invoke.config import AmbiguousMergeError
from invoke.exceptions import UncastableEnvVar, UnknownFileType
from invoke.util import yaml as invoke_yaml

import tfcluster
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


class TfclusterProgram(Program):
    """`tfcluster`: the tasks of tfcluster/cli.py from any folder. Settings come as they do for `invoke` (its
    system and user files, INVOKE_TFCLUSTER_* and flags), and the project file is the invoke.yaml
    of the folder the command runs in, when there is one."""

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


def main() -> None:
    """The `tfcluster` console script (pyproject.toml [project.scripts])."""
    take_environment()
    TfclusterProgram(namespace=ns, version=tfcluster.__version__, name="tfcluster", binary="tfcluster",
             binary_names=["tfcluster"]).run()

