"""tfcluster tasks for `invoke` run from this folder: `invoke --list` shows them, `invoke --help TASK`
explains one. The same tasks are the installed `tfcluster` command, which works from any folder
(tfcluster/cli.py holds them)."""

import sys

import invoke.program

from tfcluster import cli, program
from tfcluster.cli import ns  # noqa: F401  (invoke loads the collection named `ns`)

cli.take_environment()  # Before invoke reads INVOKE_TFCLUSTER_* (tfcluster/cli.py says why).
sys.excepthook = program.excepthook  # invoke reads invoke.yaml after this, outside any task.
program.hint_slips(invoke.program.Program)  # A slip on the command line: one `error:` line with the fix.
