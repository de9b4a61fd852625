"""tfcluster tasks for `invoke` run from this folder: `invoke --list` shows them, `invoke --help TASK`
explains one. The same tasks are the installed `tfcluster` command, which works from any folder
(tfcluster/cli.py holds them)."""

from tfcluster.cli import ns  # noqa: F401  (invoke loads the collection named `ns`)
