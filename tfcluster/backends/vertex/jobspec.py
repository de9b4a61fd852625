"""One attempt of a run as a Vertex AI CustomJob: the body customJobs.create takes.

From the CustomJob reference (aiplatform.v1) and https://cloud.google.com/vertex-ai/docs/training/distributed-training:
- workerPoolSpecs[0] is the primary replica ("set the replica count to 1"), [1] the other workers:
  Vertex AI sets TF_CONFIG with them as chief and worker, and CLUSTER_SPEC;
- machineSpec is the machine type and the accelerators of the cluster's GPU (tfcluster/gpus.py),
  named by MachineSpec.acceleratorType's enum (ACCELERATORS below);
- containerSpec runs the cluster's image: `command` is a small bootstrap (BOOTSTRAP) that fetches
  the run's code from the bucket with the job account's token (metadata.google.internal, as on
  any Google VM) and runs the trainer or the script in it, unchanged;
- baseOutputDirectory is the run's folder in the bucket, so Vertex AI sets AIP_MODEL_DIR,
  AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR (<dir>/model/, /checkpoints/, /logs/), the same
  for every attempt: a retry resumes from the backup the last one left;
- scheduling: timeout (the --budget's time at the cluster's rate, or max_run_hours), strategy SPOT
  with --spot, and restartJobOnWorkerRestart always, since MultiWorkerMirroredStrategy cannot
  lose a worker: when one restarts (a Spot preemption), every replica starts again;
- with --provisioning flex-start, strategy FLEX_START (Dynamic Workload Scheduler) and
  maxWaitDuration, the --capacity-wait minutes; from
  https://cloud.google.com/vertex-ai/docs/training/schedule-jobs-dws: L4, A100 or H100 GPUs (the
  config's Flex-start rule: G2, A2, A3), a timeout of 7 days or less (capped here), one machine
  configuration for every pool (always here), and a maxWaitDuration of 0 waits without end, so
  --capacity-wait 0 (ask once, on gcp) becomes one minute: a job never waits forever unasked;
- serviceAccount: the cluster's jobs account (terraform/vertex.tf).
Labels follow Google's syntax (lowercase letters, digits, _ and -, at most 63 characters).
"""

from __future__ import annotations

import re

# tfcluster/gpus.py's GPU -> MachineSpec.acceleratorType (aiplatform.v1.json's enum; the test
# checks every GPU of the table against the document).
ACCELERATORS = {"t4": "NVIDIA_TESLA_T4", "v100": "NVIDIA_TESLA_V100", "l4": "NVIDIA_L4", "a100": "NVIDIA_TESLA_A100",
                "a100-80gb": "NVIDIA_A100_80GB", "h100": "NVIDIA_H100_80GB"}
# A Flex-start job's longest timeout (schedule-jobs-dws: "7 days or less").
FLEX_START_MAX_TIMEOUT = 7 * 24 * 3600
# What every replica runs: fetch the code and tfcluster's worker support (two tar.gz in the bucket,
# named by content) with the job account's token; with `train --requirements`, a third object, the
# file (requirements/<sha256>.txt), pip-installed into the workers' interpreter (the argv's first word)
# before the program, a failure ending the replica with one line naming the file, the worker and
# pip's last line (SkyPilot's `setup:`; every start of a replica installs, as its container is new);
# then run the program as a child, forwarding SIGTERM and SIGINT (the bootstrap is PID 1 of its
# container, which would ignore them), and exit with its status. Standard library only: it runs
# on whatever Python the image has. Its first line marks each start of a replica, so the
# launcher sees when Vertex AI restarts the job. A 403 on the fetch is retried for 8 minutes: the
# jobs account's grant on the bucket is new after `up`, and "Changes to allow or deny policies
# typically propagate in 2 minutes, but could potentially take 7 minutes or longer"
# (https://cloud.google.com/iam/docs/access-change-propagation); other errors for about 2 minutes.
IAM_PROPAGATION_SECONDS = 480
OTHER_ERRORS_SECONDS = 120
BOOTSTRAP = r"""
import json, os, signal, socket, subprocess, sys, tarfile, tempfile, time, urllib.parse, urllib.request
IAM_PROPAGATION_SECONDS, OTHER_ERRORS_SECONDS = %d, %d
head, argv = sys.argv[1:sys.argv.index("--")], sys.argv[sys.argv.index("--") + 1:]
spec = json.loads(os.environ.get("CLUSTER_SPEC") or '{"task": {"type": "workerpool0", "index": 0}}')
task = spec.get("task", {})
index = 0 if task.get("type") == "workerpool0" else 1 + int(task.get("index", 0))
print("=== tfcluster: worker-%d (%s-%s) starts on %s ===" % (index, task.get("type"), task.get("index"),
      socket.gethostname()), flush=True)
ask = urllib.request.Request("http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token",
                             headers={"Metadata-Flavor": "Google"})
folder = tempfile.mkdtemp(prefix="tfcluster-")
for url, part in zip(head, ("code", "worker", "requirements")):
    bucket, _, name = url[5:].partition("/")
    start, pause = time.monotonic(), 1
    while True:
        try:
            token = json.load(urllib.request.urlopen(ask, timeout=30))["access_token"]
            get = urllib.request.Request("https://storage.googleapis.com/storage/v1/b/%s/o/%s?alt=media"
                                         % (bucket, urllib.parse.quote(name, safe="")),
                                         headers={"Authorization": "Bearer " + token})
            with open(folder + "/bundle.tar.gz", "wb") as handle:
                handle.write(urllib.request.urlopen(get, timeout=120).read())
            break
        except OSError as error:
            limit = IAM_PROPAGATION_SECONDS if getattr(error, "code", None) == 403 else OTHER_ERRORS_SECONDS
            if time.monotonic() - start + pause > limit:
                sys.exit("tfcluster: cannot fetch the run's %s from %s: %s" % (part, url, error))
            time.sleep(pause)
            pause = min(pause * 2, 30)
    if part == "requirements":
        os.replace(folder + "/bundle.tar.gz", folder + "/requirements.txt")
        continue
    with tarfile.open(folder + "/bundle.tar.gz") as tar:
        tar.extractall(folder + "/" + part)
if len(head) > 2:
    pip = subprocess.run([argv[0], "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q", "-r",
                          folder + "/requirements.txt"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = [line.strip() for line in pip.stdout.splitlines() if line.strip()]
    if pip.returncode:
        sys.exit("tfcluster: pip could not install --requirements %s on worker-%d: %s"
                 % (head[2].rsplit("/", 1)[-1], index, said[-1] if said else "exit status %d" % pip.returncode))
    print("tfcluster: requirements %s installed on worker-%d" % (head[2].rsplit("/", 1)[-1], index), flush=True)
os.chdir(folder + "/code")
os.environ["TFCLUSTER_WORKER_INDEX"] = str(index)
os.environ["PYTHONPATH"] = os.pathsep.join([folder + "/code", folder + "/worker",
                                            folder + "/worker/tfcluster/workerpath"])
child = subprocess.Popen(argv)
for number in (signal.SIGTERM, signal.SIGINT):
    signal.signal(number, lambda signum, frame: child.send_signal(signum))
status = child.wait()
sys.exit(status if status >= 0 else 128 - status)
""".replace("%d, %d", f"{IAM_PROPAGATION_SECONDS}, {OTHER_ERRORS_SECONDS}", 1)
LABEL = re.compile(r"[^a-z0-9_-]")


def label(value: str) -> str:
    """A label value Google accepts: lowercase, [a-z0-9_-], at most 63 characters."""
    return LABEL.sub("-", value.lower())[:63]


def machine_spec(machine_type: str, gpu: str, gpu_count: int) -> dict:
    spec = {"machineType": machine_type}
    if gpu_count:
        spec.update(acceleratorType=ACCELERATORS[gpu], acceleratorCount=gpu_count)
    return spec


def job_body(*, cluster: str, run_id: str, attempt: int, workers: int, image: str, bundles: list[str], argv: list[str],
             env: dict[str, str], machine: dict, bucket: str, service_account: str, timeout_seconds: int,
             spot: bool, boot_disk_gb: int, flex_start_wait_minutes: float | None = None) -> dict:
    """The CustomJob of one attempt (see the module's text)."""
    container = {"imageUri": image, "command": ["python3", "-c", BOOTSTRAP, *bundles, "--", *argv],
                 "env": [{"name": key, "value": value} for key, value in sorted(env.items())]}
    pool = {"machineSpec": machine, "diskSpec": {"bootDiskType": "pd-ssd", "bootDiskSizeGb": boot_disk_gb},
            "containerSpec": container}
    pools = [{**pool, "replicaCount": "1"}]
    if workers > 1:
        pools.append({**pool, "replicaCount": str(workers - 1)})
    if flex_start_wait_minutes is not None:
        timeout_seconds = min(timeout_seconds, FLEX_START_MAX_TIMEOUT)
    scheduling = {"timeout": f"{max(1, int(timeout_seconds))}s", "restartJobOnWorkerRestart": True}
    if spot:
        scheduling["strategy"] = "SPOT"
    elif flex_start_wait_minutes is not None:
        scheduling["strategy"] = "FLEX_START"
        scheduling["maxWaitDuration"] = f"{max(60, round(flex_start_wait_minutes * 60))}s"
    return {"displayName": f"tfcluster {cluster} {run_id} attempt {attempt}",
            "labels": {"tfcluster-cluster": label(cluster), "tfcluster-run": label(run_id),
                       "tfcluster-attempt": str(attempt)},
            "jobSpec": {"workerPoolSpecs": pools, "scheduling": scheduling, "serviceAccount": service_account,
                        "baseOutputDirectory": {"outputUriPrefix": f"gs://{bucket}/runs/{run_id}/"}}}


def job_id(name: str) -> str:
    """projects/N/locations/R/customJobs/ID -> ID (the job_id label of its Cloud Logging entries)."""
    return name.rsplit("/", 1)[-1]


def worker_of(task: str) -> int | None:
    """workerpool0-0 -> 0, workerpool1-K -> K + 1 (tfcluster's worker index); None for others ("service")."""
    match = re.fullmatch(r"workerpool([01])-(\d+)", task or "")
    if match is None:
        return None
    return 0 if match[1] == "0" else 1 + int(match[2])


def task_of(worker: int) -> str:
    return "workerpool0-0" if worker == 0 else f"workerpool1-{worker - 1}"
