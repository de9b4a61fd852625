"""Errors a user can fix. ``str(error)`` is one line that names the fix; tasks.py prints it."""


class TfClusterError(Exception):
    """Base for every error shown to the user as one line, without a traceback."""

    exit_code = 2


class ConfigError(TfClusterError):
    """A bad setting: names the key, the bad value and the valid values."""


class ClusterError(TfClusterError):
    """The cluster is missing, busy or in a state that does not allow the command."""


class TrainingFailed(TfClusterError):
    """A worker failed; the message names it. The log tail is printed before this."""

    exit_code = 1
