"""A Vertex AI stand-in behind {region}-aiplatform.googleapis.com: customJobs create, get, list and
cancel, whose replicas run as Docker containers from the job's own image
(tests/world/vertex_replicas.py) and write their output to Cloud Logging
(tests/world/cloud_logging.py).

Every request and answer goes through Google's discovery document, aiplatform.v1.json
(tests/world/discovery.py). Modelled, with sources:
- **Endpoints**: the document's "Locational Endpoint" list, https://{region}-aiplatform.googleapis.com/;
  names are projects/{project NUMBER}/locations/{region}/customJobs/{numeric id}, the form
  every public transcript of a job shows (e.g. ".../customJobs/5942175266485829632").
- **States** (CustomJob.state and its enumDescriptions): JOB_STATE_QUEUED "just created ... and
  processing has not yet begun", JOB_STATE_PENDING "the service is preparing to run the job",
  JOB_STATE_RUNNING "in progress", then SUCCEEDED, FAILED, or CANCELLING, from which "the job may
  only go to either JOB_STATE_SUCCEEDED, JOB_STATE_FAILED or JOB_STATE_CANCELLED". startTime is when
  it "for the first time entered the JOB_STATE_RUNNING state", endTime when it entered SUCCEEDED,
  FAILED or CANCELLED; error only on FAILED or CANCELLED. "Understand the custom training
  service" (https://cloud.google.com/vertex-ai/docs/training/understanding-training-service):
  without enough remaining training quota a job stays QUEUED until there is; replicas start in
  parallel and the job is RUNNING "when all the workers are available".
- **cancel** (the method's own description): "asynchronous cancellation"; on success the job
  "becomes a job with a CustomJob.error value with a google.rpc.Status.code of 1, corresponding to
  Code.CANCELLED, and CustomJob.state is set to CANCELLED". Cancelling an ended job is 400
  FAILED_PRECONDITION (google.rpc's code for an operation the resource's state refuses).
- **Quota at submission**: a job that asks for more accelerators than the region's custom training
  quota is refused at create with 429 RESOURCE_EXHAUSTED "The following quota metrics exceed quota
  limits: aiplatform.googleapis.com/custom_model_training_nvidia_l4_gpus"
  (GoogleCloudPlatform/stable-diffusion-on-gcp#12; the k80 and cpus forms in
  GoogleCloudPlatform/vertex-ai-samples#700 and #3479); Spot jobs draw on the
  custom_model_training_preemptible_* metrics (https://cloud.google.com/vertex-ai/docs/quotas#training),
  and so do Flex-start jobs (tests/world/facts.py, VERTEX_FLEX_START_QUOTA); every replica's vCPUs count
  on custom_model_training_cpus or its preemptible_ form (vertex-ai-samples#700, #3479).
- **The replicas' environment** (https://cloud.google.com/vertex-ai/docs/training/distributed-training
  and CustomJobSpec.baseOutputDirectory in the document): worker pool 0 is the primary replica,
  pool 1 the workers, 2 parameter servers, 3 evaluators; CLUSTER_SPEC {"cluster": {"workerpool0":
  ["host:port"], ...}, "environment": "cloud", "task": {"type": "workerpool1", "index": 0, "trial":
  ""}, "job": the CustomJobSpec}; TF_CONFIG the same with TensorFlow's task names (chief, worker,
  ps; an evaluator is never in "cluster"); host names "cmle-training-workerpool0-<hash>-0:2222" as
  public CLUSTER_SPEC transcripts show (google-deepmind/xmanager cloud/utils_test.py, ydf
  vertex_ai tests); with baseOutputDirectory set, AIP_MODEL_DIR = <dir>/model/,
  AIP_CHECKPOINT_DIR = <dir>/checkpoints/, AIP_TENSORBOARD_LOG_DIR = <dir>/logs/.
- **A replica that exits non-zero** fails the job: the others are stopped and the job is FAILED
  with "The replica workerpool0-0 exited with a non-zero status of 1. To find out more about why
  your job exited please check the logs: https://console.cloud.google.com/logs/viewer?..." (the
  error as public transcripts quote it), and the service log says "The replica workerpool0-0 exited
  with a non-zero status of 1. Termination reason: Error." at ERROR. (Google restarts a replica
  that fails with a "non-permanent" error up to five times first; the exits tfcluster's tests
  plant are the permanent kind, so that path is not modelled.) The error's google.rpc code is
  not in any transcript found; this stand-in sends 3 and the product reads only the message.
- **Spot preemption** (https://cloud.google.com/vertex-ai/docs/training/use-spot-vms, and the
  training service page's restarts): a preempted replica is restarted with the same host name;
  with scheduling.restartJobOnWorkerRestart "Restarts the entire CustomJob if a worker gets
  restarted", every replica starts again. Preempted time is not billed.
- **scheduling.timeout**, "The maximum job running time. The default is 7 days": past it the
  job's replicas are stopped and it ends FAILED, code 4 (DEADLINE_EXCEEDED; the message's
  wording is this stand-in's).
- **The service's own log lines** (task_name "service"), as `gcloud ai custom-jobs stream-logs`
  transcripts show them: "Waiting for job to be provisioned.", "Job is preparing.", "Job is
  running.", "Tearing down training program.", "Finished tearing down training program.", "Job
  completed successfully.".
- **Values a field's description lists** where the document has no enum are refused like enum values
  (issue 45): DiskSpec.bootDiskType's description says 'Valid values: "pd-ssd" ..., "pd-standard" ...
  or "hyperdisk-balanced"', read from the document itself; the refusal's wording is this stand-in's.
- A request without a bearer token is 401; with the API disabled, 403 SERVICE_DISABLED; a caller
  without the method's permission (Compute's ``missing_permissions``), 403 PERMISSION_DENIED
  "Permission 'aiplatform.customJobs.create' denied on resource ... (or it may not exist)."
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field

from tests.world import compute_auth, discovery
from tests.world.cloud_logging import FilterError, parse_filter, rfc3339
from tests.world.http import JsonServer
from tests.world import facts
from tests.world.vertex_replicas import NET, TF_PORT, Replica

VERTEX_REGIONS = ("us-central1", "us-east1", "us-east4", "us-west1", "europe-west4", "asia-east1")
VERTEX_NAMES = tuple(f"{region}-aiplatform.googleapis.com" for region in VERTEX_REGIONS)
ENDED = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED")
# MachineSpec.acceleratorType -> the word its custom training quota metric uses.
QUOTA_WORDS = {"NVIDIA_TESLA_T4": "nvidia_t4", "NVIDIA_TESLA_V100": "nvidia_v100", "NVIDIA_L4": "nvidia_l4",
               "NVIDIA_TESLA_A100": "nvidia_a100", "NVIDIA_A100_80GB": "nvidia_a100_80gb",
               "NVIDIA_H100_80GB": "nvidia_h100"}
TF_TASKS = {0: "chief", 1: "worker", 2: "ps", 3: "evaluator"}
PERMISSIONS = {"create": "aiplatform.customJobs.create", "get": "aiplatform.customJobs.get",
               "list": "aiplatform.customJobs.list", "cancel": "aiplatform.customJobs.cancel"}
# Google restarts a preempted Spot job at most this often before it fails
# (https://cloud.google.com/vertex-ai/docs/predictions/use-spot-vms: "up to six times").
SPOT_RESTARTS = 6


def described_values(schema: str, field: str) -> list[str]:
    """The values a field's description lists ('Valid values: "a" (...), "b" ... or "c"'), from aiplatform.v1.json."""
    description = discovery.api("aiplatform.v1").schemas[schema]["properties"][field]["description"]
    return re.findall(r'"([a-z0-9-]+)"', description.split("Valid values:", 1)[1])


def quota_metric(accelerator: str, spot: bool) -> str:
    return f"custom_model_training_{'preemptible_' if spot else ''}{QUOTA_WORDS[accelerator]}_gpus"


def cpu_quota_metric(preemptible: bool) -> str:
    return f"custom_model_training_{'preemptible_' if preemptible else ''}cpus"


@dataclass
class Job:
    id: str
    region: str
    # The CustomJob as get answers it.
    record: dict
    # A short hash in the replicas' host names, fixed for the job.
    hash: str
    replicas: list = field(default_factory=list)
    cancel: threading.Event = field(default_factory=threading.Event)
    # Whole-job restarts after a preemption.
    restarts: int = 0
    # Every state the job went through, with this machine's time, for the tests to read.
    history: list = field(default_factory=list)

    @property
    def state(self) -> str:
        return self.record["state"]

    @property
    def spot(self) -> bool:
        return (self.record["jobSpec"].get("scheduling") or {}).get("strategy") == "SPOT"

    @property
    def preemptible(self) -> bool:
        """Its strategy draws the preemptible quota (facts.VERTEX_STRATEGY_QUOTA: SPOT and FLEX_START)."""
        strategy = (self.record["jobSpec"].get("scheduling") or {}).get("strategy") or "STANDARD"
        return bool(facts.VERTEX_STRATEGY_QUOTA.get(strategy))

    def usage(self) -> dict[str, int]:
        """Quota metric -> accelerators, and vCPUs on the CPU metric."""
        from tests.world.quotas import _shape

        found: dict[str, int] = {}
        for pool in self.record["jobSpec"]["workerPoolSpecs"]:
            machine = (pool or {}).get("machineSpec") or {}
            kind, count = machine.get("acceleratorType"), int(machine.get("acceleratorCount") or 0)
            replicas = int((pool or {}).get("replicaCount") or 0)
            if kind in QUOTA_WORDS and count:
                metric = quota_metric(kind, self.preemptible)
                found[metric] = found.get(metric, 0) + count * replicas
            vcpus = _shape(machine.get("machineType") or "", [])[0]
            if vcpus:
                metric = cpu_quota_metric(self.preemptible)
                found[metric] = found.get(metric, 0) + vcpus * replicas
        return found


@dataclass
class VertexState:
    project: str
    project_number: str
    jobs: dict = field(default_factory=dict)
    # (region, quota metric) -> limit; absent: ``default_quota`` (GPUs) or ``default_cpu_quota`` (vCPUs).
    quota: dict = field(default_factory=dict)
    default_quota: int = 16
    # The world's choice; a test that depends on the CPU quota sets its own.
    default_cpu_quota: int = 64
    # Seconds a job spends PENDING before its replicas start (Vertex AI provisions machines then).
    provision_seconds: float = 0.3
    # Seconds between a replica's SIGTERM and its SIGKILL when the service stops it (a replica's
    # program is PID 1 of its container, which ignores a SIGTERM it has no handler for).
    stop_grace_seconds: int = 5
    # Every request: (verb, path, body), for the tests to read.
    requests: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def limit(self, region: str, metric: str) -> int:
        default = self.default_cpu_quota if metric.endswith("_cpus") else self.default_quota
        return self.quota.get((region, metric), default)

    def quota_infos(self, project: str) -> list[dict]:
        """Vertex AI's training quotas as the Cloud Quotas API lists them (tests/world/cloudquotas.py):
        one QuotaInfo per accelerator metric and the vCPU one, on-demand and preemptible, a limit per
        region (the quota ID's wording is this stand-in's; the metric is the one Vertex AI's 429 names)."""
        infos = []
        metrics = [quota_metric(kind, spot) for kind in sorted(QUOTA_WORDS) for spot in (False, True)]
        for metric in metrics + [cpu_quota_metric(False), cpu_quota_metric(True)]:
            quota_id = "".join(part.capitalize() for part in metric.split("_")) + "PerProjectPerRegion"
            infos.append({
                "name": f"projects/{project}/locations/global/services/aiplatform.googleapis.com/quotaInfos/{quota_id}",
                "quotaId": quota_id, "metric": f"aiplatform.googleapis.com/{metric}",
                "service": "aiplatform.googleapis.com", "isPrecise": True, "containerType": 1,
                "dimensions": ["region"],
                "dimensionsInfos": [{"dimensions": {"region": region}, "applicableLocations": [region],
                                     **({"details": {"value": str(self.limit(region, metric))}}
                                        if self.limit(region, metric) else {})}
                                    for region in VERTEX_REGIONS]})
        return infos

    def in_use(self, region: str, metric: str, besides: str = "") -> int:
        return sum(job.usage().get(metric, 0) for job in self.jobs.values()
                   if job.region == region and job.id != besides and job.state not in ENDED
                   and job.state != "JOB_STATE_QUEUED")


def _error(code: int, status: str, message: str, reason: str = "", service: str = "aiplatform.googleapis.com",
           project: str = "") -> tuple[int, dict]:
    error = {"code": code, "message": message, "status": status}
    if reason:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason,
                             "domain": "googleapis.com", "metadata": {"service": service,
                                                                       "consumer": f"projects/{project}"}}]
    return code, {"error": error}


class Vertex:
    """The service: its API answers, each job's life, and the replicas (through ``runtime()``)."""

    def __init__(self, state: VertexState, compute, project_apis, logging_state, runtime):
        # runtime() -> the ReplicaRuntime, made when the first job needs it.
        self.state, self.compute, self.project_apis, self.logging = state, compute, project_apis, logging_state
        self.runtime = runtime

    # -- API ---------------------------------------------------------------------------------

    def route(self, verb: str, path: str, query: dict, body, headers: dict) -> tuple[int, dict]:
        with self.state.lock:
            self.state.requests.append((verb, path, body))
        caller, refused = compute_auth.principal(self.compute, headers)
        if refused:
            return _error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials. Expected OAuth 2 "
                          "access token, login cookie or other valid authentication credential.")
        if not self.project_apis.enabled("aiplatform.googleapis.com"):
            return _error(403, "PERMISSION_DENIED", f"Vertex AI API has not been used in project {self.state.project} "
                          "before or it is disabled. Enable it by visiting https://console.developers.google.com/apis/"
                          f"api/aiplatform.googleapis.com/overview?project={self.state.project} then retry.",
                          "SERVICE_DISABLED", project=self.state.project)
        return discovery.serve("aiplatform.v1", verb, path, query, body,
                               lambda call: self._answer(call, caller))

    def _answer(self, call, caller: str) -> tuple[int, dict]:
        method = call.id.rsplit(".", 1)[-1]
        if not call.id.startswith("aiplatform.projects.locations.customJobs.") or method not in PERMISSIONS:
            return _error(501, "UNIMPLEMENTED", f"stand-in: {call.id} is not modelled")
        target = call.path_params.get("name") or call.path_params.get("parent")
        match = re.match(r"projects/([^/]+)/locations/([^/]+)", target)
        if match is None or match[1] not in (self.state.project, self.state.project_number):
            return _error(403, "PERMISSION_DENIED", f"Permission '{PERMISSIONS[method]}' denied on resource "
                          f"'//aiplatform.googleapis.com/{target}' (or it may not exist).")
        region = match[2]
        if caller != compute_auth.OPERATOR or PERMISSIONS[method] in self.compute.missing_permissions:
            return _error(403, "PERMISSION_DENIED", f"Permission '{PERMISSIONS[method]}' denied on resource "
                          f"'//aiplatform.googleapis.com/{target}' (or it may not exist).", "IAM_PERMISSION_DENIED")
        if method == "create":
            return self.create(region, call.body or {})
        if method == "list":
            return self.list(region, call.query)
        job = self.state.jobs.get(target.rsplit("/", 1)[-1])
        if job is None or job.region != region:
            return _error(404, "NOT_FOUND", f"The CustomJob does not exist: {target}")
        if method == "get":
            with self.state.lock:
                return 200, json.loads(json.dumps(job.record))
        return self.cancel(job)

    def create(self, region: str, body: dict) -> tuple[int, dict]:
        spec = body.get("jobSpec") or {}
        pools = spec.get("workerPoolSpecs") or []
        missing = [] if body.get("displayName") else ["display_name"]
        if not pools or not pools[0]:
            missing.append("job_spec.worker_pool_specs")
        for index, pool in enumerate(pools):
            if pool and not (pool.get("containerSpec") or {}).get("imageUri"):
                missing.append(f"job_spec.worker_pool_specs[{index}].container_spec.image_uri")
            if pool and not (pool.get("machineSpec") or {}).get("machineType"):
                missing.append(f"job_spec.worker_pool_specs[{index}].machine_spec.machine_type")
        if missing:
            return _error(400, "INVALID_ARGUMENT", "; ".join(f"{name}: Required field is not set." for name in missing))
        valid = described_values("GoogleCloudAiplatformV1DiskSpec", "bootDiskType")
        for index, pool in enumerate(pools):
            kind = ((pool or {}).get("diskSpec") or {}).get("bootDiskType")
            if kind is not None and kind not in valid:
                return _error(400, "INVALID_ARGUMENT", f"job_spec.worker_pool_specs[{index}].disk_spec.boot_disk_type: "
                              f"\"{kind}\" is not a valid value; valid values are {', '.join(valid)}.")
        job_id = str(secrets.randbelow(9 * 10 ** 18) + 10 ** 18)
        now = rfc3339(time.time())
        for pool in (body.get("jobSpec") or {}).get("workerPoolSpecs") or []:
            if pool and "replicaCount" in pool:  # int64: a JSON string in Google's answers.
                pool["replicaCount"] = str(pool["replicaCount"])
        record = {**body, "name": f"projects/{self.state.project_number}/locations/{region}/customJobs/{job_id}",
                  "state": "JOB_STATE_QUEUED", "createTime": now, "updateTime": now}
        job = Job(job_id, region, record, secrets.token_hex(5))
        over = [metric for metric, count in job.usage().items() if count > self.state.limit(region, metric)]
        if over:
            return _error(429, "RESOURCE_EXHAUSTED", "The following quota metrics exceed quota limits: "
                          + ", ".join(f"aiplatform.googleapis.com/{metric}" for metric in over))
        with self.state.lock:
            self.state.jobs[job_id] = job
            job.history.append(("JOB_STATE_QUEUED", time.time()))
            answer = json.loads(json.dumps(record))
        threading.Thread(target=self._life, args=(job,), daemon=True, name=f"vertex-job-{job_id}").start()
        return 200, answer

    def list(self, region: str, query: dict) -> tuple[int, dict]:
        text = (query.get("filter") or [""])[0]
        try:
            matches = parse_filter(text) if text.strip() else (lambda entry: True)
        except FilterError as error:
            return _error(400, "INVALID_ARGUMENT", f"Unparseable filter: {error}")
        size = int((query.get("pageSize") or ["100"])[0] or 100)
        start = int((query.get("pageToken") or ["0"])[0] or 0)
        with self.state.lock:
            jobs = [json.loads(json.dumps(job.record)) for job in self.state.jobs.values() if job.region == region]
        # The filter names fields as the API's list reference does: display_name, state, create_time, labels.KEY.
        found = [job for job in jobs if matches({"display_name": job.get("displayName"), "state": job["state"],
                                                 "create_time": job["createTime"], "labels": job.get("labels", {})})]
        answer = {"customJobs": found[start:start + size]} if found[start:start + size] else {}
        if start + size < len(found):
            answer["nextPageToken"] = str(start + size)
        return 200, answer

    def cancel(self, job: Job) -> tuple[int, dict]:
        with self.state.lock:
            if job.state in ENDED or job.state == "JOB_STATE_CANCELLING":
                return _error(400, "FAILED_PRECONDITION", f"Cannot cancel CustomJob {job.record['name']} in state "
                              f"{job.state}.")
            self._set(job, "JOB_STATE_CANCELLING")
        job.cancel.set()
        return 200, {}

    # -- A job's life --------------------------------------------------------------------------

    def _set(self, job: Job, state: str, error: dict | None = None) -> None:
        """(Under the state's lock.) The job's new state and times."""
        now = time.time()
        job.record["state"] = state
        job.record["updateTime"] = rfc3339(now)
        if state == "JOB_STATE_RUNNING" and "startTime" not in job.record:
            job.record["startTime"] = rfc3339(now)
        if state in ENDED:
            job.record["endTime"] = rfc3339(now)
        if error is not None:
            job.record["error"] = error
        job.history.append((state, now))

    def service_log(self, job: Job, message: str, severity: str = "INFO") -> None:
        self.log(job.id, "service", message, severity)

    def log(self, job_id: str, task: str, message: str, severity: str, at: float | None = None) -> None:
        resource = {"type": "ml_job", "labels": {"job_id": job_id, "project_id": self.state.project,
                                                 "task_name": task}}
        self.logging.write(task, resource, message, severity, at)

    def _life(self, job: Job) -> None:
        try:
            self._run(job)
        except Exception as error:  # A world that broke must not leave containers behind.
            import traceback

            traceback.print_exc()
            with self.state.lock:
                if job.state not in ENDED:
                    self._set(job, "JOB_STATE_FAILED", {"code": 13, "message": f"stand-in broke: {error}"})
            if job.replicas:
                self.runtime().stop(job.replicas, 1)
                self.runtime().remove(job.replicas)

    def _wait_for_quota(self, job: Job) -> bool:
        """QUEUED while other jobs hold the quota this one needs; False when cancelled meanwhile."""
        while not job.cancel.is_set():
            with self.state.lock:
                if all(self.state.in_use(job.region, metric, job.id) + count <= self.state.limit(job.region, metric)
                       for metric, count in job.usage().items()):
                    self._set(job, "JOB_STATE_PENDING")
                    return True
            time.sleep(0.2)
        return False

    def _run(self, job: Job) -> None:
        self.service_log(job, "Waiting for job to be provisioned.")
        if not self._wait_for_quota(job):
            return self._cancelled(job)
        self.service_log(job, "Job is preparing.")
        time.sleep(self.state.provision_seconds)
        if job.cancel.is_set():
            return self._cancelled(job)
        runtime = self.runtime()
        spec = job.record["jobSpec"]
        job.replicas = self._replicas(job, runtime)
        failed = self._start_all(job, runtime)
        if failed:
            return self._failed(job, failed)
        with self.state.lock:
            if job.state == "JOB_STATE_PENDING":
                self._set(job, "JOB_STATE_RUNNING")
        self.service_log(job, "Job is running.")
        timeout = _seconds((spec.get("scheduling") or {}).get("timeout") or "604800s")
        started = time.monotonic()
        while True:
            if job.cancel.is_set():
                return self._cancelled(job)
            if time.monotonic() - started > timeout:
                return self._end(job, runtime, job.replicas, "JOB_STATE_FAILED", {
                    "code": 4, "message": "The job ran past its maximum running time (scheduling.timeout "
                    f"{spec['scheduling']['timeout']})."})
            preempted = [r for r in job.replicas if r.ended_by == "preempted" and r.exit_code is not None]
            if preempted:
                if not self._restart(job, runtime, preempted):
                    return None
                continue
            broken = [r for r in job.replicas if r.exit_code not in (None, 0) and not r.ended_by]
            if broken:
                return self._replica_failed(job, runtime, broken[0])
            if all(r.exit_code == 0 for r in job.replicas):
                self.service_log(job, "Tearing down training program.")
                runtime.remove(job.replicas)
                self.service_log(job, "Finished tearing down training program.")
                self.service_log(job, "Job completed successfully.")
                with self.state.lock:
                    self._set(job, "JOB_STATE_SUCCEEDED")
                return None
            time.sleep(0.2)

    def _replicas(self, job: Job, runtime) -> list[Replica]:
        pools = job.record["jobSpec"]["workerPoolSpecs"]
        shape = [(p, i) for p, pool in enumerate(pools) if pool for i in range(int(pool.get("replicaCount") or 0))]
        addresses = runtime.allocate(len(shape))
        return [Replica(task=f"workerpool{p}-{i}", pool=p, index=i, host=f"cmle-training-workerpool{p}-{job.hash}-{i}",
                        address=address, container=f"tfc-vtx{NET}-{job.id}-{p}-{i}")
                for (p, i), address in zip(shape, addresses)]

    def _environment(self, job: Job, replica: Replica) -> dict[str, str]:
        spec = job.record["jobSpec"]
        pools = [r for r in job.replicas]
        cluster = {}
        for other in pools:
            cluster.setdefault(f"workerpool{other.pool}", []).append(f"{other.host}:{TF_PORT}")
        tf_cluster = {TF_TASKS[int(pool[-1])]: hosts for pool, hosts in cluster.items() if pool != "workerpool3"}
        task = {"type": f"workerpool{replica.pool}", "index": replica.index, "trial": ""}
        env = {"CLUSTER_SPEC": json.dumps({"cluster": cluster, "environment": "cloud", "task": task, "job": spec}),
               "TF_CONFIG": json.dumps({"cluster": tf_cluster, "environment": "cloud", "job": spec,
                                        "task": {**task, "type": TF_TASKS[replica.pool]}})}
        base = ((spec.get("baseOutputDirectory") or {}).get("outputUriPrefix") or "").rstrip("/")
        if base:
            env.update({"AIP_MODEL_DIR": f"{base}/model/", "AIP_CHECKPOINT_DIR": f"{base}/checkpoints/",
                        "AIP_TENSORBOARD_LOG_DIR": f"{base}/logs/"})
        pool = spec["workerPoolSpecs"][replica.pool]
        for item in (pool.get("containerSpec") or {}).get("env") or []:
            env[item["name"]] = item["value"]
        return env

    def _start_all(self, job: Job, runtime, only: list | None = None) -> tuple | None:
        """Start the replicas (all, or ``only``) at once: None, or (replica, Docker's words) of one that
        could not start."""
        spec = job.record["jobSpec"]
        account = spec.get("serviceAccount") or f"service-{self.state.project_number}@gcp-sa-aiplatform-cc.iam." \
                                                "gserviceaccount.com"
        results: dict[str, str | None] = {}

        def start(replica: Replica) -> None:
            container = spec["workerPoolSpecs"][replica.pool]["containerSpec"]
            results[replica.task] = runtime.run(job.id, replica, job.replicas, container["imageUri"],
                                                container.get("command") or [], container.get("args") or [],
                                                self._environment(job, replica), account)

        threads = [threading.Thread(target=start, args=(r,)) for r in (only or job.replicas)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        failed = [(r, results[r.task]) for r in (only or job.replicas) if results.get(r.task)]
        return failed[0] if failed else None

    def _end(self, job: Job, runtime, stopping: list[Replica], state: str, error: dict, grace: float | None = None):
        """Stop ``stopping`` (SIGTERM, then SIGKILL after the grace), remove every replica, end the job."""
        runtime.stop(stopping, self.state.stop_grace_seconds if grace is None else grace)
        runtime.remove(job.replicas)
        with self.state.lock:
            self._set(job, state, error)

    def _failed(self, job: Job, failed: tuple) -> None:
        replica, words = failed
        message = f"The replica {replica.task} could not start: {words}"
        self.service_log(job, message, "ERROR")
        self._end(job, self.runtime(), job.replicas, "JOB_STATE_FAILED", {"code": 3, "message": message}, grace=1)

    def _replica_failed(self, job: Job, runtime, replica: Replica) -> None:
        code = replica.exit_code
        self.service_log(job, f"The replica {replica.task} exited with a non-zero status of {code}. "
                              "Termination reason: Error.", "ERROR")
        link = (f"https://console.cloud.google.com/logs/viewer?project={self.state.project_number}&resource=ml_job%2F"
                f"job_id%2F{job.id}&advancedFilter=resource.type%3D%22ml_job%22%0Aresource.labels.job_id%3D%22{job.id}%22")
        self._end(job, runtime, [r for r in job.replicas if r is not replica], "JOB_STATE_FAILED", {"code": 3, "message": (
            f"The replica {replica.task} exited with a non-zero status of {code}. To find out more about why your "
            f"job exited please check the logs: {link}")})

    def _restart(self, job: Job, runtime, preempted: list[Replica]) -> bool:
        """After a preemption: the whole job again (restartJobOnWorkerRestart), or the preempted
        replicas alone; False when the job ended (too many restarts, or cancelled)."""
        scheduling = job.record["jobSpec"].get("scheduling") or {}
        job.restarts += 1
        if job.restarts > SPOT_RESTARTS:
            self._end(job, runtime, job.replicas, "JOB_STATE_FAILED", {
                "code": 8, "message": f"STOCKOUT: the Spot capacity for the job was reclaimed {SPOT_RESTARTS + 1} times."})
            return False
        again = job.replicas if scheduling.get("restartJobOnWorkerRestart") else preempted
        runtime.stop([r for r in again if r.exit_code is None], self.state.stop_grace_seconds)
        for replica in again:
            for thread in replica.threads:
                thread.join(timeout=15)
        failed = self._start_all(job, runtime, again)
        if failed:
            self._failed(job, failed)
            return False
        return True

    def _cancelled(self, job: Job) -> None:
        if not job.replicas:  # Cancelled while queued: no container was started.
            with self.state.lock:
                self._set(job, "JOB_STATE_CANCELLED", {"code": 1, "message": "CANCELED"})
            return
        self._end(job, self.runtime(), job.replicas, "JOB_STATE_CANCELLED", {"code": 1, "message": "CANCELED"})

    # -- What tests do to a job, as Google's side would --------------------------------------------

    def preempt(self, job_id: str, task: str) -> None:
        """Compute Engine reclaims the Spot VM of one replica."""
        job = self.state.jobs[job_id]
        if not job.spot:
            raise ValueError("only a Spot job's replicas can be preempted")
        replica = next(r for r in job.replicas if r.task == task)
        self.runtime().kill(replica, "preempted")

    def wait(self, job_id: str, states, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state.jobs[job_id].state
            if state in states:
                return state
            time.sleep(0.1)
        raise AssertionError(f"job {job_id} still {self.state.jobs[job_id].state} after {timeout} s")


def _seconds(duration: str) -> float:
    """A google-duration ("3600s", "1.5s") in seconds."""
    return float(duration.rstrip("s"))


class VertexServer:
    """The API over HTTPS on ``address``:443, where every {region}-aiplatform.googleapis.com points."""

    def __init__(self, vertex: Vertex, address: str, context):
        self.vertex = vertex
        self.http = JsonServer(address, context, vertex.route)

    def close(self) -> None:
        self.http.close()
