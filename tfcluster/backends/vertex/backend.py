"""VertexBackend: `up` makes the bucket, the registry and the jobs' service account with the
gcp backend's Terraform module (workers = 0, vertex = true: no VM, no network); each attempt of a
run is a Vertex AI CustomJob (job.py); `down` cancels the cluster's jobs that still run, then
destroys what `up` made, keeping results as on gcp.

A Vertex AI cluster has no machines: its worker slots are the replicas of each job
(worker-0 is workerpool0-0, the chief; worker-K is workerpool1-(K-1)), and the hosts the
launcher sees are the run folder on this machine, where each replica's lines arrive from Cloud
Logging (logs.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tfcluster.backends.base import Backend, JobSpec, Staged
from tfcluster.backends.gcp.cloud import MODULE_DIR, Terraform, adopt_kept_repository, translated
from tfcluster.backends.gcp.vms import bucket_rule, destroy_keeping_results
from tfcluster.backends.local import PROJECT_ROOT, LocalHost
from tfcluster.backends.vertex import jobspec, money, preflight, stage
from tfcluster.backends.vertex.api import ENDED, Jobs, Logs
from tfcluster.backends.vertex.job import VertexJob
from tfcluster import provisioning
from tfcluster.errors import ClusterError, ConfigError
from tfcluster.state import ClusterState, HostRecord

# The port Vertex AI gives every replica's TensorFlow server (CLUSTER_SPEC's host:2222).
TF_PORT = 2222
JOBS_FILE = "vertex-jobs.json"  # In a run's folder: attempt -> the job's name.
STARTUP_DIR = MODULE_DIR.parent / "startup"


def region_of(settings) -> str:
    region = settings.region or (settings.zone.rsplit("-", 1)[0] if settings.zone and settings.zone != "auto" else "")
    if not settings.project or not region:
        raise ConfigError("the vertex backend needs --project and --region (a Vertex AI region such as us-central1) "
                          "(or tfcluster.project / tfcluster.region in invoke.yaml)")
    return region


class VertexBackend(Backend):
    """Training as Vertex AI custom jobs, in the cluster's own bucket and with its own account."""

    name = "vertex"
    hosts_outlive_cluster = False
    can_halt_machines = False  # No machine of the cluster runs between jobs.
    installs_requirements_in_job = True  # The job's bootstrap pip-installs them (jobspec.BOOTSTRAP).
    tune_unsupported = ("tune is not supported on the vertex backend yet: run the search on your own VMs "
                        "(`invoke up --backend gcp`, then `invoke tune`), or use Vertex AI's hyperparameter tuning "
                        "jobs; `invoke train` runs on Vertex AI")
    tensorboard_folder = "logs"  # Vertex AI's AIP_TENSORBOARD_LOG_DIR is <baseOutputDirectory>/logs/.

    def __init__(self, store, announce=print):
        self._store = store
        self._announce = announce
        self._budget_end: float | None = None

    def workdir(self, cluster_name: str) -> Path:
        return self._store.root / "vertex" / cluster_name

    def config(self, cluster: ClusterState) -> dict:
        """What `up` fixed for the cluster's jobs: region, account, machine, Spot, the time cap."""
        path = self.workdir(cluster.name) / "vertex.json"
        if not path.exists():
            raise ClusterError(f"cluster {cluster.name} has no Vertex AI settings ({path} is missing); run "
                               "`invoke down`, then `invoke up --backend vertex`")
        return json.loads(path.read_text())

    def check(self, settings) -> list:
        return preflight.run(settings, region_of(settings))

    # ------------------------------------------------------------ up and down

    def variables(self, settings, region: str) -> dict:
        """The gcp module's variables for a cluster without VMs (terraform/vertex.tf)."""
        return {"project": settings.project, "cluster_name": settings.cluster, "workers": 0, "vertex": True,
                # The module places VMs in `zone`; without any, only its region is read, and registry_location
                # names it anyway: any zone of the region will do.
                "zone": settings.zone if settings.zone.startswith(region + "-") else f"{region}-a",
                "registry_location": region, "bucket_location": settings.bucket_location or region.upper(),
                "bucket_retention_days": settings.bucket_retention_days,
                "bucket_force_destroy": settings.bucket_force_destroy,
                # main.tf reads them whether or not a VM boots with them.
                "startup_script": str(STARTUP_DIR / "startup.sh"), "watchdog_source": str(STARTUP_DIR / "tfcluster_watchdog")}

    def up(self, settings, existing):
        if existing is not None:
            return existing
        region = region_of(settings)
        terraform = Terraform(self.workdir(settings.cluster), project=settings.project)  # Fails early if missing.
        # Before anything is created: the same lines as `invoke check --backend vertex`, and a stop on any ✗.
        findings = preflight.run(settings, region)
        for finding in findings:
            self._announce(finding.line())
        failed = [finding for finding in findings if finding.holds is False]
        if failed:
            raise ConfigError(failed[0].detail if len(failed) == 1 else
                              f"{len(failed)} prerequisites fail ({', '.join(f.subject for f in failed)}); each ✗ "
                              "line above names its fix")
        gpu = f" + {settings.gpu_count} x {jobspec.ACCELERATORS[settings.gpu]}" if settings.gpu_count else ""
        self._announce(f"plan: a bucket, a registry and a service account for Vertex AI jobs in {region}; each "
                       f"`train` runs as a job of {settings.machine_type}{gpu} replicas{' (SPOT)' if settings.spot else ''}"
                       ", and no machine bills between jobs")
        self._announce(bucket_rule(settings.bucket_retention_days))
        began = time.time()
        self._store.save_cluster(ClusterState(name=settings.cluster, backend=self.name, hosts=[], status="provisioning",
                                              project=settings.project, zone=region, created_at=began))
        with translated(settings.project, "up"):
            terraform.prepare(self.variables(settings, region))
            adopt_kept_repository(terraform, settings.project, region, settings.cluster, self._announce)
            terraform.apply()
            outputs = {name: item["value"] for name, item in
                       json.loads(terraform.run("output", "-json", "-no-color") or "{}").items()}
        (terraform.workdir / "vertex.json").write_text(json.dumps({
            "region": region, "service_account": outputs["jobs_service_account"],
            "machine_type": settings.machine_type, "gpu": settings.gpu, "gpu_count": settings.gpu_count,
            "spot": settings.spot, "boot_disk_gb": settings.boot_disk_gb, "max_run_hours": settings.max_run_hours,
            # --provisioning flex-start: each job waits up to these minutes for its GPUs (jobspec.py).
            "flex_start_wait_minutes": (settings.capacity_wait_minutes
                                        if settings.provisioning == provisioning.FLEX_START else None)},
            indent=2, sort_keys=True))
        records = [HostRecord(name=f"worker-{i}", address=jobspec.task_of(i), tf_port=TF_PORT)
                   for i in range(settings.workers)]
        return ClusterState(name=settings.cluster, backend=self.name, hosts=records, project=settings.project,
                            zone=region, bucket=outputs["bucket"], registry=outputs["registry"],
                            image=settings.image, created_at=began)

    def teardown(self, cluster, keep: bool, delete_bucket: bool = False) -> None:
        """Cancel the cluster's jobs that still run (each bills while it runs), then destroy what `up`
        made, keeping a bucket or registry that holds something (as on gcp) unless told otherwise."""
        if cluster.status == "up":
            self.cancel_jobs(cluster)
        terraform = Terraform(self.workdir(cluster.name), project=cluster.project)
        with translated(cluster.project, "down"):
            kept = destroy_keeping_results(cluster, terraform, delete_bucket, self._announce)
        if cluster.status == "up":
            left = [job["name"] for job in self._jobs(cluster).list(_cluster_filter(cluster))
                    if job.get("state") not in ENDED]
            if left:
                raise ClusterError(f"Vertex AI jobs of the cluster still run after their cancel: {', '.join(left)}; "
                                   "cancel them in the console (Vertex AI > Training > Custom jobs), then run "
                                   "`invoke down` again")
            self._announce(f"verified through Vertex AI (label tfcluster-cluster={jobspec.label(cluster.name)}): no "
                           "job of the cluster runs")
        for line in kept.lines:
            self._announce(line)

    def cancel_jobs(self, cluster) -> list[str]:
        """Cancel every job of the cluster that has not ended, and wait until each has; their names."""
        jobs = self._jobs(cluster)
        running = [job for job in jobs.list(_cluster_filter(cluster)) if job.get("state") not in ENDED]
        for job in running:
            self._announce(f"cancelling Vertex AI job {job['name']} ({job.get('state')})")
            folder = self._store.run_dir(job.get("labels", {}).get("tfcluster-run", "unknown-run"))
            VertexJob(jobs, self._logs(cluster), folder).attach(job["name"], job).cancel()
        return [job["name"] for job in running]

    # ------------------------------------------------------------ a run

    def hosts(self, cluster) -> list[LocalHost]:
        return [LocalHost(record, self._store) for record in cluster.hosts]

    def preflight(self, cluster, hosts, need_tensorflow: bool, image: str = "") -> None:
        """Vertex AI runs every worker in an image it pulls from a registry."""
        if not image:
            raise ConfigError(f"the vertex backend runs every worker in a container image: build one with `invoke "
                              f"image build` (it pushes to the cluster's registry {cluster.registry}) or give "
                              "--image REGISTRY/PATH:TAG")
        host = image.split("/", 1)[0]
        if "/" not in image or not ("." in host or ":" in host):
            raise ConfigError(f"image {image} names no registry, and Vertex AI pulls the image itself: push it to the "
                              f"cluster's registry {cluster.registry} (`invoke image build` does) and give that reference")

    def stage(self, cluster, hosts, run_id: str, payload) -> Staged:
        return stage.stage(cluster.project, cluster.bucket, payload, PROJECT_ROOT)

    def before_retry(self, hosts, run_id: str) -> None:
        """The backup is in the bucket, under the run's folder every attempt's job shares."""

    def collect(self, hosts, run_id: str, local_run_dir: Path, succeeded: bool) -> str | None:
        """The logs are here already (Cloud Logging, as they came); the model stays in the bucket
        (`invoke pull` fetches it)."""
        return None

    def leftover_processes(self, cluster) -> list[str]:
        """No process of the cluster runs on this machine; its jobs are checked by teardown."""
        return []

    def kill_leftovers(self, cluster) -> None:
        """See leftover_processes."""

    def leftover_containers(self, cluster) -> dict[str, list[str]]:
        """Vertex AI runs the containers and removes them with the job."""
        return {}

    def remove_containers(self, cluster) -> None:
        """See leftover_containers."""

    def pre_pull(self, cluster, image: str) -> list[str]:
        """Nothing to pull ahead: each job's machines pull the image when the job starts."""
        return []

    def hourly_rate(self, cluster, settings) -> float | None:
        """A job of the cluster's workers, per hour, at Vertex AI's training prices, Spot held to on-demand
        (money.py)."""
        return money.budget_hourly(self.config(cluster), len(cluster.hosts))

    def spend_sync(self, cluster, settings, book, own: str = "", run: str = "") -> list[str]:
        """Each job's replicas into the ledger, from the job's own startTime and endTime (money.py);
        nothing bills between jobs, so `up` and `down` record nothing of their own."""
        config = self.config(cluster)
        known = {(event.instance, event.kind) for event in book.events()}
        with translated(cluster.project, "reading the cluster's Vertex AI jobs for the cost ledger"):
            jobs = self._jobs(cluster).list(_cluster_filter(cluster))
        book.append([event for job in jobs for event in money.job_events(job, known)])
        replicas = max([len(money.replicas_of(job)) for job in jobs] or [len(cluster.hosts)])
        book.note_prices(money.prices_record(config, replicas))
        return []

    def set_budget_end(self, cluster, end: float | None) -> None:
        """The next job's scheduling.timeout is the time left until ``end``."""
        self._budget_end = end

    def cloud_job(self, cluster, run_id: str, spec: JobSpec) -> VertexJob:
        config = self.config(cluster)
        env = dict(spec.env)
        bundles = env.pop(stage.BUNDLES, "").split()
        if len(bundles) not in (2, 3):  # Code, worker support, and the --requirements file if any.
            raise ClusterError(f"run {run_id} has no staged code in the bucket; start it again with `invoke train`")
        machine = jobspec.machine_spec(config["machine_type"], config["gpu"], config["gpu_count"])

        def body(attempt: int) -> dict:
            timeout = config["max_run_hours"] * 3600
            if self._budget_end is not None:
                timeout = min(timeout, self._budget_end - time.time())
            if timeout <= 0:
                raise ClusterError(f"run {run_id}'s --budget has no time left for another job")
            return jobspec.job_body(cluster=cluster.name, run_id=run_id, attempt=attempt, workers=spec.workers,
                                    image=spec.image, bundles=bundles, argv=spec.argv, env=env, machine=machine,
                                    bucket=cluster.bucket, service_account=config["service_account"],
                                    timeout_seconds=int(timeout), spot=config["spot"],
                                    boot_disk_gb=config["boot_disk_gb"],
                                    flex_start_wait_minutes=config.get("flex_start_wait_minutes"))

        folder = self._store.run_dir(run_id)

        def record(attempt: int, name: str) -> None:
            path = folder / JOBS_FILE
            known = json.loads(path.read_text()) if path.exists() else {}
            path.write_text(json.dumps({**known, str(attempt): name}, indent=2, sort_keys=True))

        return VertexJob(self._jobs(cluster), self._logs(cluster), folder, body, record)

    def cloud_job_of(self, cluster, run_id: str, attempt: int) -> VertexJob:
        """The job of a run's attempt, as recorded when it was submitted (one that names no job when
        none was: its look() says so)."""
        path = self._store.run_dir(run_id) / JOBS_FILE
        name = json.loads(path.read_text()).get(str(attempt)) if path.exists() else None
        job = VertexJob(self._jobs(cluster), self._logs(cluster), self._store.run_dir(run_id))
        return job.attach(name) if name else job

    def _jobs(self, cluster) -> Jobs:
        return Jobs(cluster.project, cluster.zone)

    def _logs(self, cluster) -> Logs:
        return Logs(cluster.project, cluster.zone)


def _cluster_filter(cluster) -> str:
    return f'labels.tfcluster-cluster="{jobspec.label(cluster.name)}"'
