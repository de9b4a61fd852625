"""The vertex backend: each attempt of a run as a Vertex AI custom job; `up` and `down` make and
remove the bucket, the registry and the jobs' service account with the gcp backend's Terraform
module (no VM, no network).

Rooms: api (customJobs and Cloud Logging's entries.list over REST with google-auth: no
google-cloud-aiplatform, no google-cloud-logging; the decision is written there), jobspec (the
CustomJob body of an attempt: worker pools, machine, image, the bootstrap that fetches the code,
scheduling), stage (the code, worker support and data in the cluster's bucket), logs (a job's
lines from Cloud Logging into each worker's local log, within Logging's read quota), job
(VertexJob, the CloudJob of base.py: submit, poll, cancel), backend (VertexBackend). May import
tfcluster.backends.{base,gcp,local,ssh}, state, config and errors; never commands or launch.
"""

from tfcluster.backends.vertex.backend import VertexBackend

__all__ = ["VertexBackend"]
