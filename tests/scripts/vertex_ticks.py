"""A small job for the vertex tests, on Python alone: every worker prints a tick every half second
for --seconds, then exits 0. A run's first job leaves a marker per worker in the run's checkpoint
folder (Cloud Storage's JSON API, with the token the machine's metadata server gives), as a backup
would be, so its later jobs know they resume: with --fail-once, worker 1 of the first job exits 3;
with --first-seconds, the first job ticks that long instead; a later job says it resumes."""
import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=5)
parser.add_argument("--fail-once", action="store_true")
parser.add_argument("--first-seconds", type=float, default=None)
args = parser.parse_args()
index = int(os.environ.get("TFCLUSTER_WORKER_INDEX", "0"))


def first_job() -> bool:
    """Whether this is the run's first job for this worker (no marker yet; one is left now)."""
    ask = urllib.request.Request("http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/"
                                 "default/token", headers={"Metadata-Flavor": "Google"})
    token = json.load(urllib.request.urlopen(ask))["access_token"]
    bucket, _, prefix = os.environ["AIP_CHECKPOINT_DIR"][5:].partition("/")
    name = urllib.parse.quote(f"{prefix}ticked-{index}", safe="")
    headers = {"Authorization": "Bearer " + token}
    try:
        urllib.request.urlopen(urllib.request.Request(
            f"https://storage.googleapis.com/storage/v1/b/{bucket}/o/{name}", headers=headers))
        return False
    except urllib.error.HTTPError as error:
        if error.code != 404:
            raise
    urllib.request.urlopen(urllib.request.Request(
        f"https://storage.googleapis.com/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}",
        data=b"1", method="POST", headers={**headers, "Content-Type": "text/plain"}))
    return True


first = first_job() if args.fail_once or args.first_seconds is not None else True
if args.fail_once and index == 1 and first:
    print("worker 1 fails on purpose", flush=True)
    sys.exit(3)
if not first:
    print("resumes after an earlier job", flush=True)
seconds = args.first_seconds if args.first_seconds is not None and first else args.seconds
end = time.time() + seconds
tick = 0
while time.time() < end:
    print(f"tick {tick}", flush=True)
    tick += 1
    time.sleep(0.5)
print("done ticking", flush=True)
