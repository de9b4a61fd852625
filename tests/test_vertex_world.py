"""The Vertex AI and Cloud Logging stand-ins (tests/world/vertex.py, cloud_logging.py) as Google
describes them, driven over REST with google-auth as any client would: the replicas' environment,
the job's states, and the unhappy paths Google documents. Python-only replicas, no TensorFlow:
what the world does to a job does not depend on what the job runs.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest

from tests import imagelab
from tests.world.compute_auth import token_for
from tests.world.iam_api import create_account
from tests.world.vertex_replicas import LABEL, NET

REGION = "us-central1"
PARENT = f"https://{REGION}-aiplatform.googleapis.com/v1/projects/demo-project/locations/{REGION}"
LOGS = "https://logging.googleapis.com/v2/entries:list"
BUCKET = "vertex-world-bucket"
# What every replica runs: its environment on stdout, a line on stderr, the chief's TF port answered
# by each worker, and an object written to the bucket with the token metadata.google.internal gives it.
REPLICA = r"""
import json, os, socket, sys, time, urllib.request
spec = json.loads(os.environ["CLUSTER_SPEC"])
print(json.dumps({"host": socket.gethostname(), **{k: os.environ.get(k) for k in
      ("CLUSTER_SPEC", "TF_CONFIG", "AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR", "MINE")}}), flush=True)
print("on stderr", file=sys.stderr, flush=True)
chief = spec["cluster"]["workerpool0"][0].split(":")
if spec["task"]["type"] == "workerpool0":
    server = socket.create_server(("0.0.0.0", int(chief[1])))
    for _ in spec["cluster"].get("workerpool1", []):
        server.accept()[0].sendall(b"hello")
else:
    for _ in range(100):
        try:
            print("chief says", socket.create_connection((chief[0], int(chief[1])), timeout=5).recv(5).decode(), flush=True)
            break
        except OSError:
            time.sleep(0.1)
request = urllib.request.Request("http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token",
                                 headers={"Metadata-Flavor": "Google"})
token = json.load(urllib.request.urlopen(request))["access_token"]
name = spec["task"]["type"] + "-" + str(spec["task"]["index"])
upload = urllib.request.Request(f"https://storage.googleapis.com/upload/storage/v1/b/%s/o?uploadType=media&name={name}"
                                % os.environ["BUCKET"], data=b"x", method="POST",
                                headers={"Authorization": "Bearer " + token, "Content-Type": "text/plain"})
print("wrote", json.load(urllib.request.urlopen(upload))["name"], flush=True)
sys.exit(int(os.environ.get("EXIT_" + name, "0")))
"""
SLEEPER = "import socket, time; print('start', socket.gethostname(), flush=True); time.sleep(600)"


@pytest.fixture(scope="session")  # Cached images, the same in every worker: no order between tests.
def python_image():
    reason = imagelab.ensure_dockerd()
    if reason:
        pytest.skip(f"docker: {reason}")
    (_, python_only), _ = imagelab.build()
    # What `docker push` to the project's Artifact Registry would have left there.
    reference = f"{REGION}-docker.pkg.dev/demo-project/default-images/python:lab{NET}"
    subprocess.run(["docker", "tag", python_only, reference], check=True, capture_output=True)
    yield reference
    subprocess.run(["docker", "rmi", reference], capture_output=True)


@pytest.fixture
def google(world):
    import google.auth
    from google.auth.transport.requests import AuthorizedSession

    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    return AuthorizedSession(credentials)


def job_body(image: str, command: list[str], workers: int = 1, env: dict | None = None, **spec) -> dict:
    machine = {"machineType": "n1-standard-4", "acceleratorType": "NVIDIA_TESLA_T4", "acceleratorCount": 1}
    container = {"imageUri": image, "command": command, "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}
    pools = [{"machineSpec": machine, "replicaCount": "1", "containerSpec": container}]
    if workers:
        pools.append({"machineSpec": machine, "replicaCount": str(workers), "containerSpec": container})
    return {"displayName": "world-test", "labels": {"tfcluster-cluster": "default"},
            "jobSpec": {"workerPoolSpecs": pools, **spec}}


def containers() -> list[str]:
    return subprocess.run(["docker", "ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}"],
                          capture_output=True, text=True, check=True).stdout.split()


def entries(google, job_id: str, page_size: int = 1000, extra: str = "") -> list[dict]:
    found, token = [], None
    while True:
        body = {"resourceNames": ["projects/demo-project"], "pageSize": page_size,
                "filter": f'resource.type="ml_job" AND resource.labels.job_id="{job_id}"{extra}'}
        if token:
            body["pageToken"] = token
        answer = google.post(LOGS, json=body)
        assert answer.status_code == 200, answer.text
        found += answer.json().get("entries", [])
        token = answer.json().get("nextPageToken")
        if not token:
            return found


def test_replicas_get_vertex_environment_and_the_unhappy_paths(world, google, python_image):
    vertex = world.vertex.vertex
    vertex.state.stop_grace_seconds = 1  # The sleepers have no SIGTERM handler: they wait for the SIGKILL.
    project = world.compute.state.project
    account = create_account(world.compute.state, project, "vertex-jobs", {})["email"]
    from google.cloud import storage

    storage.Client(project=project).create_bucket(BUCKET)
    world.storage_proxy.policies[BUCKET] = [{"role": "roles/storage.objectAdmin", "members": [f"serviceAccount:{account}"]}]
    world.cloud_logging.state.ingest_delays["workerpool1-0"] = 1.5  # Readable later than the chief's lines.

    # The happy job: one chief and two workers, Vertex AI's environment, logs, the job's own identity.
    body = job_body(python_image, ["python3", "-c", REPLICA], workers=2, env={"MINE": "kept", "BUCKET": BUCKET},
                    baseOutputDirectory={"outputUriPrefix": f"gs://{BUCKET}/runs/r1"}, serviceAccount=account)
    created = google.post(f"{PARENT}/customJobs", json=body)
    assert created.status_code == 200, created.text
    job = created.json()
    assert job["state"] == "JOB_STATE_QUEUED" and "startTime" not in job
    assert job["name"].startswith(f"projects/{world.project_apis.apis.project_number}/locations/{REGION}/customJobs/")
    job_id = job["name"].rsplit("/", 1)[1]

    # Meanwhile, the unhappy paths on their own jobs.
    vertex.state.quota[(REGION, "custom_model_training_nvidia_t4_gpus")] = 3
    refused = google.post(f"{PARENT}/customJobs", json=job_body(python_image, ["true"], workers=3))
    assert refused.status_code == 429 and refused.json()["error"] == {
        "code": 429, "status": "RESOURCE_EXHAUSTED", "message": "The following quota metrics exceed quota limits: "
        "aiplatform.googleapis.com/custom_model_training_nvidia_t4_gpus"}
    failing = google.post(f"{PARENT}/customJobs", json=job_body(
        python_image, ["python3", "-c", REPLICA], workers=1, env={"BUCKET": BUCKET, "EXIT_workerpool1-0": "3"},
        serviceAccount=account)).json()
    sleeper = google.post(f"{PARENT}/customJobs", json=job_body(python_image, ["python3", "-c", SLEEPER], workers=0)).json()
    timed = google.post(f"{PARENT}/customJobs", json=job_body(python_image, ["python3", "-c", SLEEPER], workers=0,
                                                              scheduling={"timeout": "2s"})).json()
    spot = google.post(f"{PARENT}/customJobs", json=job_body(
        python_image, ["python3", "-c", SLEEPER], workers=1,
        scheduling={"strategy": "SPOT", "restartJobOnWorkerRestart": True})).json()

    final = vertex.wait(job_id, ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"), 120)
    record = google.get(f"https://{REGION}-aiplatform.googleapis.com/v1/{job['name']}").json()
    assert final == "JOB_STATE_SUCCEEDED", record
    assert [state for state, _ in vertex.state.jobs[job_id].history] == [
        "JOB_STATE_QUEUED", "JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED"]
    assert record["createTime"] <= record["startTime"] <= record["endTime"] and "error" not in record
    # workerpool1-0's lines become readable 1.5 s late (ingest_delays): wait for its last one.
    _wait(lambda: any(e["jsonPayload"]["message"] == "wrote workerpool1-0" for e in entries(google, job_id)), 10)
    lines = entries(google, job_id, page_size=3)  # Pages of 3: nextPageToken until the last.
    by_task: dict[str, list[dict]] = {}
    for entry in lines:
        by_task.setdefault(entry["resource"]["labels"]["task_name"], []).append(entry)
    assert sorted(by_task) == ["service", "workerpool0-0", "workerpool1-0", "workerpool1-1"]
    assert [e["jsonPayload"]["message"] for e in by_task["service"]] == [
        "Waiting for job to be provisioned.", "Job is preparing.", "Job is running.", "Tearing down training program.",
        "Finished tearing down training program.", "Job completed successfully."]
    environments = {}
    for task in ("workerpool0-0", "workerpool1-0", "workerpool1-1"):
        messages = [(e["severity"], e["jsonPayload"]["message"]) for e in by_task[task]]
        assert ("ERROR", "on stderr") in messages
        assert ("INFO", f"wrote {task}") in messages
        environments[task] = json.loads(next(m for s, m in messages if m.startswith("{")))
    chief, worker = environments["workerpool0-0"], environments["workerpool1-1"]
    cluster = json.loads(chief["CLUSTER_SPEC"])["cluster"]
    assert list(cluster) == ["workerpool0", "workerpool1"] and len(cluster["workerpool1"]) == 2
    assert all(address.endswith(":2222") and address.startswith("cmle-training-workerpool")
               for addresses in cluster.values() for address in addresses)
    assert chief["host"] == cluster["workerpool0"][0].split(":")[0]
    assert json.loads(worker["CLUSTER_SPEC"])["task"] == {"type": "workerpool1", "index": 1, "trial": ""}
    tf_config = json.loads(worker["TF_CONFIG"])
    assert tf_config["cluster"] == {"chief": cluster["workerpool0"], "worker": cluster["workerpool1"]}
    assert tf_config["task"]["type"] == "worker" and tf_config["task"]["index"] == 1
    assert json.loads(chief["TF_CONFIG"])["task"]["type"] == "chief"
    assert (chief["AIP_MODEL_DIR"], chief["AIP_CHECKPOINT_DIR"], chief["AIP_TENSORBOARD_LOG_DIR"]) == (
        f"gs://{BUCKET}/runs/r1/model/", f"gs://{BUCKET}/runs/r1/checkpoints/", f"gs://{BUCKET}/runs/r1/logs/")
    assert chief["MINE"] == "kept"
    assert any(m == "chief says hello" for _, m in [(e["severity"], e["jsonPayload"]["message"])
                                                    for e in by_task["workerpool1-0"]])
    # The objects were written by the job's own service account (the storage door checks its roles).
    assert sorted(b.name for b in storage.Client(project=project).list_blobs(BUCKET)) == [
        "workerpool0-0", "workerpool1-0", "workerpool1-1"]

    # A replica that exits non-zero: the job FAILED with Google's words, the others stopped.
    failing_id = failing["name"].rsplit("/", 1)[1]
    assert vertex.wait(failing_id, ("JOB_STATE_FAILED", "JOB_STATE_SUCCEEDED"), 120) == "JOB_STATE_FAILED"
    error = vertex.state.jobs[failing_id].record["error"]
    assert error["message"].startswith("The replica workerpool1-0 exited with a non-zero status of 3. To find out "
                                       "more about why your job exited please check the logs: ")
    service = [e["jsonPayload"]["message"] for e in entries(google, failing_id, extra=' AND severity>=ERROR')
               if e["resource"]["labels"]["task_name"] == "service"]
    assert service == ["The replica workerpool1-0 exited with a non-zero status of 3. Termination reason: Error."]

    # Cancel: CANCELLING at once, then CANCELLED with code 1, and nothing left running.
    sleeper_id = sleeper["name"].rsplit("/", 1)[1]
    vertex.wait(sleeper_id, ("JOB_STATE_RUNNING",), 60)
    cancel = google.post(f"https://{REGION}-aiplatform.googleapis.com/v1/{sleeper['name']}:cancel", json={})
    assert cancel.status_code == 200 and cancel.json() == {}
    assert google.get(f"https://{REGION}-aiplatform.googleapis.com/v1/{sleeper['name']}").json()["state"] in (
        "JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED")
    assert vertex.wait(sleeper_id, ("JOB_STATE_CANCELLED",), 60)
    assert vertex.state.jobs[sleeper_id].record["error"] == {"code": 1, "message": "CANCELED"}
    again = google.post(f"https://{REGION}-aiplatform.googleapis.com/v1/{sleeper['name']}:cancel", json={})
    assert again.status_code == 400 and again.json()["error"]["status"] == "FAILED_PRECONDITION"

    # The timeout ends a job that runs past it.
    timed_id = timed["name"].rsplit("/", 1)[1]
    assert vertex.wait(timed_id, ("JOB_STATE_FAILED",), 60)
    assert vertex.state.jobs[timed_id].record["error"]["code"] == 4

    # Spot: a preempted replica restarts the whole job (restartJobOnWorkerRestart), same host names.
    spot_id = spot["name"].rsplit("/", 1)[1]
    vertex.wait(spot_id, ("JOB_STATE_RUNNING",), 60)

    def starts() -> list[str]:
        return [e["jsonPayload"]["message"] for e in entries(google, spot_id) if e["jsonPayload"]["message"].startswith("start ")]

    _wait(lambda: len(starts()) == 2, 30)
    vertex.preempt(spot_id, "workerpool1-0")
    _wait(lambda: len(starts()) == 4, 60)
    assert sorted(starts()[:2]) == sorted(starts()[2:])  # Both replicas again, each under its own name.
    assert vertex.state.jobs[spot_id].state == "JOB_STATE_RUNNING"
    google.post(f"https://{REGION}-aiplatform.googleapis.com/v1/{spot['name']}:cancel", json={})
    vertex.wait(spot_id, ("JOB_STATE_CANCELLED",), 60)

    # list pages and filters as the API's reference says.
    listed = google.get(f"{PARENT}/customJobs", params={"filter": 'state="JOB_STATE_CANCELLED"', "pageSize": 1})
    assert listed.status_code == 200 and len(listed.json()["customJobs"]) == 1 and listed.json()["nextPageToken"]
    assert google.get(f"{PARENT}/customJobs", params={"filter": 'state="JOB_'}).status_code == 400
    assert containers() == []

    # Cloud Logging: an unparseable filter is a 400, and more than 60 reads a minute a 429.
    bad = google.post(LOGS, json={"resourceNames": ["projects/demo-project"], "filter": "resource.type="})
    assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT"
    codes = [google.post(LOGS, json={"resourceNames": ["projects/demo-project"], "pageSize": 1}).status_code
             for _ in range(61)]
    assert 429 in codes and codes[-1] == 429


def test_logging_ingestion_delay_hides_late_lines_from_a_reader_that_only_moves_forward(world):
    """The ingestion delay is real: a reader that asks only for lines after the last timestamp it
    saw loses the delayed replica's earlier lines."""
    from tests.world.cloud_logging import list_entries, rfc3339

    state = world.cloud_logging.state
    state.ingest_delays["late"] = 5
    resource = {"type": "ml_job", "labels": {"job_id": "1", "task_name": "late"}}
    now = time.time()
    state.write("late", resource, "written first, readable late", at=now)
    state.write("early", {**resource, "labels": {"job_id": "1", "task_name": "early"}}, "written second", at=now + 1)
    code, page = list_entries(state, {"resourceNames": ["projects/demo-project"]}, now=now + 2)
    assert code == 200 and [e["jsonPayload"]["message"] for e in page["entries"]] == ["written second"]
    after = f'timestamp>"{page["entries"][-1]["timestamp"]}"'
    code, page = list_entries(state, {"resourceNames": ["projects/demo-project"], "filter": after}, now=now + 6)
    assert page == {}  # The late line is older than the last one seen: that reader never sees it.
    code, page = list_entries(state, {"resourceNames": ["projects/demo-project"],
                                      "filter": f'timestamp>="{rfc3339(now - 60)}"'}, now=now + 6)
    assert len(page["entries"]) == 2


def _wait(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError("timed out")


def test_the_world_refuses_described_values_and_draws_flex_start_on_preemptible_quota(world, google):
    """Values a field's description lists, where aiplatform.v1.json has no enum, are refused like enum values
    (DiskSpec.bootDiskType: pd-ssd, pd-standard, hyperdisk-balanced); a FLEX_START job draws the preemptible
    training quota (tests/world/facts.py, VERTEX_FLEX_START_QUOTA). Both refused at create: no replica runs."""
    image = f"{REGION}-docker.pkg.dev/demo-project/default-images/python:unused"
    body = job_body(image, ["true"], workers=0)
    body["jobSpec"]["workerPoolSpecs"][0]["diskSpec"] = {"bootDiskType": "pd-balanced", "bootDiskSizeGb": 100}
    refused = google.post(f"{PARENT}/customJobs", json=body)
    assert refused.status_code == 400 and refused.json()["error"]["message"] == (
        'job_spec.worker_pool_specs[0].disk_spec.boot_disk_type: "pd-balanced" is not a valid value; valid values are '
        "pd-ssd, pd-standard, hyperdisk-balanced."), refused.text
    world.vertex.vertex.state.quota[(REGION, "custom_model_training_preemptible_nvidia_t4_gpus")] = 0
    flex = google.post(f"{PARENT}/customJobs", json=job_body(image, ["true"], workers=0, scheduling={
        "strategy": "FLEX_START", "maxWaitDuration": "600s"}))
    assert flex.status_code == 429 and flex.json()["error"]["message"] == (
        "The following quota metrics exceed quota limits: aiplatform.googleapis.com/"
        "custom_model_training_preemptible_nvidia_t4_gpus"), flex.text
    assert world.vertex.vertex.state.jobs == {}
