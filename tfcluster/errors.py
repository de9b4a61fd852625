"""Errors a user can fix. ``str(error)`` is one line that names the fix; tasks.py prints it."""

import errno


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


class HostUnreachable(TfClusterError):
    """A host stopped answering (connect, auth or I/O timed out)."""

    def __init__(self, host: str, detail: str):
        super().__init__(f"{host} is unreachable: {detail}")
        self.host = host
        self.detail = detail


class HostErrors(TfClusterError):
    """Failures on several hosts at once, each named (fabric's GroupException pattern)."""

    def __init__(self, action: str, failures: dict[str, str]):
        self.failures = dict(failures)
        listed = "; ".join(f"{host}: {reason}" for host, reason in self.failures.items())
        super().__init__(f"{action} failed on {len(self.failures)} host(s): {listed}")


def file_error(error: OSError) -> str:
    """An OSError on a file as one line with the fix: a folder that cannot be written (read-only, full,
    no permission), or the file's own complaint."""
    where = error.filename or "a file"
    reason = error.strerror or str(error)
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "make it writable, or point tfcluster.state_dir (INVOKE_TFCLUSTER_STATE_DIR) at a folder you can write"
    elif error.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free some space there, or point tfcluster.state_dir (INVOKE_TFCLUSTER_STATE_DIR) at another disk"
    else:
        fix = "check that path"
    return f"cannot use {where}: {reason}; {fix}"


# What `pip install tfcluster` leaves out (pyproject.toml's `gcp` extra): Google Cloud's client libraries,
# which only the gcp and vertex backends (and gs:// folders) import. The local demo runs without them.
GCP_EXTRA = "pip install 'tfcluster[gcp]'"
# The top-level names those libraries install (google-cloud-*, google-auth, google-api-core, grpcio); not
# google.protobuf (TensorFlow's) nor google_crc32c (the TFRecord framing's, a dependency of its own).
_GOOGLE_LIBRARIES = ("google.cloud", "google.auth", "google.oauth2", "google.api_core", "google.rpc",
                     "google.longrunning", "google.type", "grpc")


def missing_google_library(error: ModuleNotFoundError) -> str | None:
    """The one line for a gcp or vertex command run without the `gcp` extra; None for any other module."""
    name = error.name or ""
    if not any(name == top or name.startswith(top + ".") for top in (*_GOOGLE_LIBRARIES, "google")) \
            or name.startswith("google.protobuf"):
        return None
    return (f"this needs Google Cloud's client libraries, which this install of tfcluster leaves out ({name} is "
            f"missing); install them with {GCP_EXTRA} (the local and ssh backends need none)")
