"""`--backend vertex`: each attempt of a run as a Vertex AI custom job, in the test world
(tests/world/vertex.py, cloud_logging.py): the real terraform on the module in terraform/, the CLI with
the product's own defaults, the replicas as containers of the `--image` tests' image.

One Spot cluster and five jobs, to keep CI short: a 3-worker job of the bundled trainer (the happy
path), a 2-worker job of a tutorial-shaped script, and one small Python-only run whose jobs walk the
unhappy paths (a failing replica then --retries, a Spot preemption, Ctrl-C, then --resume and
`invoke stop`); the quota refusal needs no job. What differs on demand (no SPOT strategy, the
on-demand quota and rates) is checked on the job's body alone.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests import imagelab
from tests.conftest import REPO, Cli, wait_for
from tests.world.provider import mirror
from tests.world.vertex_replicas import LABEL, NET

REGION = "us-west1"  # Where the world's Compute offers T4s (Vertex AI trains on its machines).
PRICES = json.loads((REPO / "tfcluster" / "backends" / "vertex" / "prices.json").read_text())


@pytest.fixture(scope="session")  # Cached images, the same in every worker: no order between tests.
def images():
    reason = imagelab.ensure_dockerd()
    if reason:
        pytest.skip(f"docker: {reason}")
    return imagelab.build()[0]


def make_vertex_cli(tmp_path, world, synthetic_data) -> Cli:
    cli = Cli(tmp_path / "state", synthetic_data)
    cli.env.update(mirror.build(tmp_path / "providers"))
    cli.env.update({"INVOKE_TFCLUSTER_BACKEND": "vertex", "INVOKE_TFCLUSTER_PROJECT": world.compute.state.project,
                    "INVOKE_TFCLUSTER_REGION": REGION})
    cli.enter(world)
    return cli


@pytest.fixture
def pushed():
    """Tag a local image as pushed to the cluster's registry (what `invoke image build` leaves there:
    Vertex AI's machines pull it from there); untagged at the end."""
    tags = []

    def push(local: str, registry: str, name: str) -> str:
        reference = f"{registry}/{name}:lab{NET}"
        subprocess.run(["docker", "tag", local, reference], check=True, capture_output=True)
        tags.append(reference)
        return reference

    yield push
    for reference in tags:
        subprocess.run(["docker", "rmi", reference], capture_output=True)


def replicas() -> list[str]:
    """The world's replica containers of this lab (tests/world/vertex_replicas.py's label)."""
    return subprocess.run(["docker", "ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}"],
                          capture_output=True, text=True, check=True).stdout.split()


class Timed:
    """A launcher's output, each line with the time it arrived."""

    def __init__(self, process: subprocess.Popen):
        self.process, self.lines = process, []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def wait(self, timeout: float) -> str:
        self.process.wait(timeout=timeout)
        self.thread.join(timeout=10)
        return "\n".join(line for _, line in self.lines)

    def first(self, text: str) -> float | None:
        return next((at for at, line in self.lines if text in line), None)


def jobs_of(world, run_id: str) -> list:
    return sorted((job for job in world.vertex.vertex.state.jobs.values()
                   if job.record.get("labels", {}).get("tfcluster-run") == run_id), key=lambda j: j.record["createTime"])


def seconds(stamp: str) -> float:
    from tests.world.cloud_logging import parse_time

    return parse_time(stamp)


def test_an_on_demand_job_has_no_spot_strategy():
    from tfcluster.backends.vertex import jobspec, money, preflight

    args = dict(cluster="default", run_id="r1", attempt=1, workers=1, image="i", bundles=[], argv=["x"], env={},
                machine=jobspec.machine_spec("n1-standard-8", "t4", 1), bucket="b", service_account="a",
                timeout_seconds=60, boot_disk_gb=50)
    assert jobspec.job_body(spot=False, **args)["jobSpec"]["scheduling"] == {"timeout": "60s",
                                                                               "restartJobOnWorkerRestart": True}
    assert jobspec.job_body(spot=True, **args)["jobSpec"]["scheduling"]["strategy"] == "SPOT"
    # --provisioning flex-start: Dynamic Workload Scheduler, waiting up to --capacity-wait, the timeout within
    # its 7 days, and Vertex AI's 0 (wait without end) never sent (schedule-jobs-dws). The body is one
    # aiplatform.v1's customJobs.create takes.
    flex = jobspec.job_body(spot=False, flex_start_wait_minutes=45, **{**args, "timeout_seconds": 30 * 24 * 3600})
    assert flex["jobSpec"]["scheduling"] == {"timeout": f"{7 * 24 * 3600}s", "restartJobOnWorkerRestart": True,
                                             "strategy": "FLEX_START", "maxWaitDuration": "2700s"}
    once = jobspec.job_body(spot=False, flex_start_wait_minutes=0, **args)["jobSpec"]["scheduling"]
    assert once["maxWaitDuration"] == "60s" and once["timeout"] == "60s"
    from tests.world import discovery

    call, refused = discovery.check("aiplatform.v1", "POST", "/v1/projects/demo-project/locations/us-west1/customJobs",
                                    {}, flex)
    assert refused is None and call is not None, refused
    assert [pool["replicaCount"] for pool in jobspec.job_body(spot=False, **args)["jobSpec"]["workerPoolSpecs"]] == ["1"]
    assert preflight.quota_metric("t4", False) == "aiplatform.googleapis.com/custom_model_training_nvidia_t4_gpus"
    on_demand, spot = (money.replica_rates("n1-standard-8", "t4", 1, flag) for flag in (False, True))
    assert on_demand["gpu"] == PRICES["accelerator_hour"]["NVIDIA_TESLA_T4"]
    assert abs(spot["gpu"] - on_demand["gpu"] * (1 - PRICES["spot_discount"])) < 1e-9


TICKS = str(REPO / "tests" / "scripts" / "vertex_ticks.py")


def test_up_train_unhappy_paths_down_on_vertex(tmp_path, world, synthetic_data, images, pushed):
    tf_image, python_image = images
    vertex = world.vertex.vertex
    vertex.state.stop_grace_seconds = 2
    cli = make_vertex_cli(tmp_path, world, synthetic_data)
    up = cli.run("up", "--spot", timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    metric = "custom_model_training_preemptible_nvidia_t4_gpus"
    assert f"✓ quota: aiplatform.googleapis.com/{metric} is 16 in us-west1" in up.stdout
    assert world.compute.state.instances == {}  # Nothing that bills between jobs.
    cluster = cli.cluster()
    account = f"default-jobs@{world.compute.state.project}.iam.gserviceaccount.com"
    assert account in world.compute.state.service_accounts
    image = pushed(tf_image, cluster["registry"], "trainer")
    small = pushed(python_image, cluster["registry"], "python")

    # Quota at submission: Vertex AI's own (Spot) T4 quota, smaller than the job; no job, one line.
    vertex.state.quota[(REGION, metric)] = 1
    refused = cli.run("train", "--workers", "2", "--image", small, "--script", TICKS, timeout=300)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stdout + refused.stderr
    assert refused.stderr.strip().splitlines() == [
        f"error: submitting the Vertex AI job: the job needs more than the custom training quota {metric} allows in "
        f"{REGION} (Vertex AI's own quota, not Compute Engine's); request more in the console (IAM & Admin > Quotas, "
        f"service aiplatform.googleapis.com, filter {metric}, region {REGION}), or use fewer workers, another GPU or "
        "another region (`invoke offers --backend vertex` shows both)"]
    assert cli.latest_run()[1]["outcome"] == "failed"
    del vertex.state.quota[(REGION, metric)]

    # --requirements (issue 47): the file goes to the bucket beside the code, and the replica's bootstrap
    # pip-installs it before the program. The lab's images have no pip (tests/imagelab.py): one line says so.
    wanted = tmp_path / "requirements.txt"
    wanted.write_text("--no-index\nnumpy\n")
    no_pip = cli.run("train", "--workers", "1", "--image", small, "--script", TICKS, "--requirements", str(wanted),
                     timeout=300)
    assert no_pip.returncode == 1 and "Traceback" not in no_pip.stderr, no_pip.stdout[-3000:] + no_pip.stderr
    [job] = jobs_of(world, cli.latest_run()[1]["run_id"])
    command = job.record["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"]
    staged = [word for word in command if word.startswith("gs://")]
    digest = hashlib.sha256(wanted.read_bytes()).hexdigest()[:16]
    assert staged[2] == f"gs://{cluster['bucket']}/requirements/{digest}.txt", command
    assert (f"worker-0 │ tfcluster: pip could not install --requirements {staged[2].rsplit('/', 1)[1]} on worker-0: "
            "/usr/bin/python3: No module named pip") in no_pip.stdout, no_pip.stdout[-3000:]

    # The bundled trainer, 3 workers, --budget as the job's timeout; lines as they come.
    launcher = Timed(cli.popen("train", "--workers", "3", "--image", image, "--budget", "2", "--",
                               "--epochs", "2", "--steps-per-epoch", "3", "--batch-size", "8", "--width", "8"))
    output = launcher.wait(600)
    assert launcher.process.returncode == 0, output[-6000:]
    run_dir, run = cli.latest_run()
    [job] = jobs_of(world, run["run_id"])
    record = job.record
    assert record["state"] == "JOB_STATE_SUCCEEDED"
    # Live: a worker's line was on the console before the job ended (within a poll of Cloud Logging).
    assert launcher.first("worker-2 │") < seconds(record["endTime"]), output[-3000:]
    assert "worker-0 │ MultiWorkerMirroredStrategy: 3 replicas in sync" in output
    summary = run["summary"]
    assert run["outcome"] == "succeeded" and summary["replicas_in_sync"] == 3 and summary["last_epoch"] == 2
    assert summary["model_dir"].startswith(f"gs://{cluster['bucket']}/runs/{run['run_id']}/model")
    # The job as Google got it.
    spec = record["jobSpec"]
    pools = spec["workerPoolSpecs"]
    assert [pool["replicaCount"] for pool in pools] == ["1", "2"]
    assert pools[0]["machineSpec"] == {"machineType": "n1-standard-8", "acceleratorType": "NVIDIA_TESLA_T4",
                                       "acceleratorCount": 1}
    assert pools[0]["containerSpec"]["imageUri"] == image
    assert spec["serviceAccount"] == account
    assert spec["baseOutputDirectory"] == {"outputUriPrefix": f"gs://{cluster['bucket']}/runs/{run['run_id']}/"}
    scheduling = spec["scheduling"]
    assert scheduling["restartJobOnWorkerRestart"] is True and scheduling["strategy"] == "SPOT"
    # --budget $2 for 3 replicas, Spot held to the on-demand rate, each replica's boot disk at its own rate (the
    # dated table's numbers, not the product's sums).
    disk_gb = json.loads((cli.state_dir / "vertex" / "default" / "vertex.json").read_text())["boot_disk_gb"]
    disk_hour = disk_gb * PRICES["boot_disk_gib_hour"]["pd-ssd"]
    machine_hour = (8 * PRICES["vcpu_hour"]["n1"] + 30 * PRICES["memory_gib_hour"]["n1"]
                    + PRICES["accelerator_hour"]["NVIDIA_TESLA_T4"])
    replica_hour = machine_hour * (1 - PRICES["spot_discount"]) + disk_hour  # What the ledger books on Spot.
    budget_seconds = 2 / (3 * (machine_hour + disk_hour)) * 3600
    assert budget_seconds - 120 < float(scheduling["timeout"].rstrip("s")) <= budget_seconds
    # The ledger: each replica from the job's startTime, billed to the next 30 s.
    billed = math.ceil((seconds(record["endTime"]) - seconds(record["startTime"])) / 30) * 30
    costs = cli.run("costs", timeout=120)
    assert costs.returncode == 0, costs.stdout + costs.stderr
    book = [json.loads(line) for line in (cli.state_dir / "ledger" / "default.jsonl").read_text().splitlines()]
    stops = [e for e in book if e["type"] == "event" and e["kind"] == "stop" and e["instance"].startswith(job.id)]
    assert len(stops) == 3 and all(abs(e["at"] - seconds(record["startTime"]) - billed) < 0.01 for e in stops)
    spent = [float(word[1:]) for word in costs.stdout.split() if word.startswith("$")]
    assert any(abs(usd - 3 * billed / 3600 * replica_hour) < 0.011 for usd in spent), costs.stdout

    # The model in the bucket: pulled, loaded in a fresh process and served through serving_default.
    pulled = cli.run("pull", timeout=300)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    # The SavedModel at the model folder's root (the trainer's export to AIP_MODEL_DIR), pulled to output/model.
    model = run_dir / "output" / "model" / summary["saved_model_path"].rstrip("/").removeprefix(
        summary["model_dir"].rstrip("/")).strip("/")
    served = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import io
        import numpy as np, tensorflow as tf
        from PIL import Image
        from trainer.synthetic import CLASSES, render
        serve = tf.saved_model.load({str(model)!r}).signatures["serving_default"]
        encoded = []
        for i in range(4):
            buffer = io.BytesIO()
            Image.fromarray(render(CLASSES[i % len(CLASSES)], 32, np.random.default_rng(i))).save(buffer, format="PNG")
            encoded.append(buffer.getvalue())
        [name] = serve.structured_input_signature[1]
        out = serve(**{{name: tf.constant(encoded)}})
        print("served", {{key: value.shape[0] for key, value in out.items()}})
        """)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert served.returncode == 0 and "served" in served.stdout and ": 4" in served.stdout, served.stderr[-2000:]

    # A user script of the tutorials' shape, unchanged: the chief's model in AIP_MODEL_DIR, no temp folder left.
    tutorial = cli.run("train", "--workers", "2", "--image", image, "--script",
                       str(REPO / "tests" / "scripts" / "vertex_tutorial.py"), timeout=600)
    assert tutorial.returncode == 0, tutorial.stdout[-4000:] + tutorial.stderr[-2000:]
    assert "replicas in sync: 2" in tutorial.stdout
    _, second = cli.latest_run()
    from google.cloud import storage

    names = [blob.name for blob in storage.Client(project=world.compute.state.project).list_blobs(
        cluster["bucket"], prefix=f"runs/{second['run_id']}/model/")]
    assert f"runs/{second['run_id']}/model/saved_model.pb" in names
    assert not [name for name in names if "workertemp" in name]

    # The unhappy paths, one small run: its first job FAILED (a replica exits 3), --retries 1 submits
    # the next, which resumes; a Spot preemption restarts that whole job and the run goes on; Ctrl-C
    # leaves it CANCELLED, no container left.
    launcher = Timed(cli.popen("train", "--workers", "2", "--image", small, "--retries", "1", "--script", TICKS,
                               "--", "--seconds", "600", "--fail-once"))
    wait_for(lambda: launcher.first("worker-1 │ tick 2"), 180, what="the second job's third tick")
    _, flaky = cli.latest_run()
    first, retried = jobs_of(world, flaky["run_id"])
    assert (first.state, retried.state) == ("JOB_STATE_FAILED", "JOB_STATE_RUNNING")
    assert retried.record["jobSpec"]["scheduling"]["strategy"] == "SPOT"
    vertex.preempt(retried.id, "workerpool1-0")
    wait_for(lambda: retried.restarts == 1 and launcher.first("the service started the job's workers again"), 120,
             what="the restart's note")
    wait_for(lambda: sum("worker-1 │ tick 1" in line for _, line in launcher.lines) >= 2, 120,
             what="worker-1 ticking again after the restart")
    status = cli.run("status", timeout=120)
    assert status.returncode == 0 and "JOB_STATE_RUNNING" in status.stdout, status.stdout + status.stderr
    launcher.process.send_signal(2)
    output = launcher.wait(120)
    assert launcher.process.returncode == 1 and "no worker is left running" in output, output[-3000:]
    assert ("✗ worker-1 (worker:0 on workerpool1-0:2222) exited with code 3; the job ended JOB_STATE_FAILED: The "
            "replica workerpool1-0 exited with a non-zero status of 3.") in output.replace("\n", " ")
    assert "worker-1 │ worker 1 fails on purpose" in output and "worker-1 │ resumes after an earlier job" in output
    assert "vertex: the service started the job's workers again (restart 1: " in output
    run_dir = cli.runs()[-1]
    for index in range(2):  # Both started twice in the second job: the whole job, not the preempted replica.
        assert (run_dir / f"worker-{index}.log").read_text().count(f"=== tfcluster: worker-{index} ") == 3
    assert [state for state, _ in retried.history][-2:] == ["JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED"]
    assert replicas() == []

    # --resume submits a new job, which resumes; `invoke stop` from another shell cancels it.
    launcher = Timed(cli.popen("train", "--resume", flaky["run_id"]))
    wait_for(lambda: sum("worker-1 │ resumes after an earlier job" in line for _, line in launcher.lines), 120,
             what="the resumed job's worker-1")
    stop = cli.run("stop", timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    output = launcher.wait(120)
    assert launcher.process.returncode == 1 and "was stopped by" in output, output[-3000:]
    jobs = jobs_of(world, flaky["run_id"])
    assert [job.state for job in jobs] == ["JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_CANCELLED"]
    assert [state for state, _ in jobs[2].history][-2:] == ["JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED"]
    assert replicas() == []

    down = cli.run("down", timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    assert replicas() == [] and account not in world.compute.state.service_accounts



def vertex_quota_line(**overrides) -> str:
    """`check --backend vertex`'s quota line for 2 replicas of g2-standard-8 with one L4 in us-west1."""
    from tfcluster import config
    from tfcluster.backends.gcp.access.check import Google, credentials_finding
    from tfcluster.backends.vertex import preflight

    settings = config.load({"backend": "vertex", "project": "demo-project", "region": "us-west1", "workers": 2,
                            "gpu": "l4", "gpu_count": 1, "machine_type": "g2-standard-8", **overrides})
    return preflight.quota_finding(Google(credentials_finding()[1]), settings, "us-west1").line()


def test_flex_start_jobs_are_judged_on_the_preemptible_training_quota(world):
    """Vertex AI Flex-start draws the preemptible training quota (tests/world/facts.py,
    VERTEX_FLEX_START_QUOTA), as Spot does, and the world's Vertex AI counts it there."""
    quota = world.vertex.vertex.state.quota
    quota[("us-west1", "custom_model_training_nvidia_l4_gpus")] = 0
    quota[("us-west1", "custom_model_training_preemptible_nvidia_l4_gpus")] = 16
    line = vertex_quota_line(provisioning="flex-start")
    assert line.startswith(
        "✓ quota: aiplatform.googleapis.com/custom_model_training_preemptible_nvidia_l4_gpus is 16 in us-west1; a job of "
        "2 replicas needs 2 GPU(s); "), line
    assert vertex_quota_line().startswith(
        "✗ quota: aiplatform.googleapis.com/custom_model_training_nvidia_l4_gpus is 0 in us-west1")
    from tests.world.vertex import Job

    body = {"jobSpec": {"scheduling": {"strategy": "FLEX_START"}, "workerPoolSpecs": [{"replicaCount": "2", "machineSpec": {
        "machineType": "g2-standard-8", "acceleratorType": "NVIDIA_L4", "acceleratorCount": 1}}]}}
    assert Job("1", "us-west1", body, "h").usage() == {"custom_model_training_preemptible_nvidia_l4_gpus": 2,
                                                       "custom_model_training_preemptible_cpus": 16}


def test_the_vertex_cpu_training_quota_is_read(world):
    """Every replica's vCPUs count on custom_model_training_cpus (its preemptible_ form for Spot); a project
    may hold it at 1 (vertex-ai-samples#700): a ✗ naming it, before any job."""
    world.vertex.vertex.state.quota[("us-west1", "custom_model_training_preemptible_cpus")] = 1
    line = vertex_quota_line(spot=True)
    assert line.startswith(
        "✗ quota: aiplatform.googleapis.com/custom_model_training_preemptible_cpus is 1 in us-west1, and a job of 2 "
        "replicas needs 16 vCPUs: request more"), line
    assert vertex_quota_line().endswith("aiplatform.googleapis.com/custom_model_training_cpus is 64 in us-west1; a job "
                                        "of 2 replicas needs 16 vCPUs (Cloud Quotas holds the limit, not what other "
                                        "jobs use now)")



def test_a_vertex_spot_budget_is_held_to_on_demand(tmp_path):
    """Vertex AI's Spot discount is its own per accelerator (an H100 about 40% off), not the table's flat
    70%: `train --budget` holds Spot jobs to the on-demand rate, as the gcp backend does."""
    from tfcluster import config
    from tfcluster.backends.vertex import money
    from tfcluster.backends.vertex.backend import VertexBackend
    from tfcluster.state import ClusterState, StateStore

    backend = VertexBackend(StateStore(config.load({"state_dir": str(tmp_path)})), announce=lambda line: None)
    spot = {"machine_type": "a3-highgpu-8g", "gpu": "h100", "gpu_count": 8, "spot": True, "boot_disk_gb": 100}
    backend.workdir("default").mkdir(parents=True)
    (backend.workdir("default") / "vertex.json").write_text(json.dumps(spot))
    rate = backend.hourly_rate(ClusterState(name="default", backend="vertex", hosts=[None, None]), None)
    assert rate == pytest.approx(money.hourly({**spot, "spot": False}, 2))
    assert money.hourly(spot, 2) < rate  # Estimates still show the Spot approximation.


def test_the_vertex_boot_disk_is_priced():
    """Each replica's boot disk bills at the price card's own disk rate (prices.json boot_disk_gib_hour)."""
    from tfcluster.backends.vertex import money

    rates = money.replica_rates("n1-standard-8", "t4", 1, False, 100)
    assert rates["disk"] == pytest.approx(100 * PRICES["boot_disk_gib_hour"]["pd-ssd"], abs=1e-6) and rates["disk"] > 0
    assert money.hourly({"machine_type": "n1-standard-8", "gpu": "t4", "gpu_count": 1, "spot": False,
                         "boot_disk_gb": 100}, 1) == pytest.approx(sum(rates.values()))


def test_the_bootstrap_waits_out_iam_propagation_on_403(tmp_path):
    """The first job after `up` may meet its account's new bucket grant before IAM has applied it: "typically
    ... 2 minutes, but could potentially take 7 minutes or longer" (access-change-propagation). The bootstrap
    retries a 403 for 8 minutes (other errors about 2), on a clock the test keeps (no real waiting)."""
    import subprocess
    import sys

    from tfcluster.backends.vertex import jobspec

    (tmp_path / "sitecustomize.py").write_text(
        "import io, json, sys, time, urllib.error, urllib.request\n"
        "clock = [0.0]\n"
        "time.monotonic = lambda: clock[0]\n"
        "def sleep(seconds):\n    clock[0] += seconds\n"
        "time.sleep = sleep\n"
        "def urlopen(request, timeout=None):\n"
        "    url = request.full_url if hasattr(request, 'full_url') else request\n"
        "    if 'metadata.google.internal' in url:\n"
        "        return io.BytesIO(json.dumps({'access_token': 'ya29.t'}).encode())\n"
        "    raise urllib.error.HTTPError(url, int(sys.argv[-1]), 'Forbidden', {}, None)\n"
        "urllib.request.urlopen = urlopen\n"
        "import atexit\natexit.register(lambda: print('waited %d' % clock[0], file=sys.stderr))\n")
    for status, low, high in ((403, 450, 480), (404, 90, 120)):
        done = subprocess.run([sys.executable, "-c", jobspec.BOOTSTRAP, "gs://b/code.tar.gz", "gs://b/worker.tar.gz",
                               "--", str(status)], env={"PYTHONPATH": str(tmp_path)}, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 1 and "cannot fetch the run's code from gs://b/code.tar.gz" in done.stderr, done.stderr
        waited = int(done.stderr.split("waited ")[-1])
        assert low <= waited <= high, (status, waited)


def test_the_bootstrap_installs_the_requirements_before_the_program(tmp_path):
    """Issue 47: `train --requirements` on Vertex AI. The staged file is the bootstrap's third object; every
    replica pip-installs it with the workers' interpreter before the program, and a failure ends the replica
    with one line naming the file, the worker and pip's last line. Real pip (--no-index: nothing downloaded)."""
    import io
    import tarfile

    from tfcluster.backends.vertex import jobspec

    bundle = io.BytesIO()
    with tarfile.open(fileobj=bundle, mode="w:gz") as tar:
        tar.addfile(tarfile.TarInfo("README"), io.BytesIO(b""))
    (tmp_path / "bundle.tar.gz").write_bytes(bundle.getvalue())
    # The metadata server's token, and storage's objects.get (alt=media): the bundles, then the file.
    (tmp_path / "sitecustomize.py").write_text(
        "import io, json, os, urllib.parse, urllib.request\n"
        "def urlopen(request, timeout=None):\n"
        "    url = request.full_url if hasattr(request, 'full_url') else request\n"
        "    if 'metadata.google.internal' in url:\n"
        "        return io.BytesIO(json.dumps({'access_token': 'ya29.t'}).encode())\n"
        "    name = urllib.parse.unquote(url.split('/o/')[1].split('?')[0])\n"
        "    folder = os.environ['OBJECTS']\n"
        "    return open(os.path.join(folder, 'bundle.tar.gz' if name.endswith('.tar.gz') else 'wanted.txt'), 'rb')\n"
        "urllib.request.urlopen = urlopen\n")
    body = jobspec.job_body(cluster="c", run_id="r", attempt=1, workers=1, image="i", argv=[
        sys.executable, "-c", "print('program ran', flush=True)"], bundles=[
        "gs://b/code/1.tar.gz", "gs://b/worker/2.tar.gz", "gs://b/requirements/abc.txt"], env={}, machine={},
        bucket="b", service_account="s", timeout_seconds=60, spot=False, boot_disk_gb=100)
    command = body["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"]
    assert command[3:7] == ["gs://b/code/1.tar.gz", "gs://b/worker/2.tar.gz", "gs://b/requirements/abc.txt", "--"]
    env = {"PYTHONPATH": str(tmp_path), "OBJECTS": str(tmp_path), "PATH": os.environ["PATH"]}
    for wanted, ok in (("--no-index\nrich\n", True), ("--no-index\ntfcluster-absent-probe==9.9\n", False)):
        (tmp_path / "wanted.txt").write_text(wanted)
        done = subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, text=True, timeout=120)
        if ok:  # Already in the interpreter: pip says so, and the program runs after it.
            assert done.returncode == 0, done.stderr
            assert done.stdout.splitlines()[-2:] == ["tfcluster: requirements abc.txt installed on worker-0",
                                                     "program ran"], done.stdout
        else:
            assert done.returncode == 1 and "program ran" not in done.stdout
            assert done.stderr.strip().splitlines() == [
                "tfcluster: pip could not install --requirements abc.txt on worker-0: ERROR: No matching "
                "distribution found for tfcluster-absent-probe==9.9"], done.stderr
