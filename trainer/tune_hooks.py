"""Keras Tuner, observed: the oracle reports each trial as a TFCLUSTER_EVENT line.

    python tune_hooks.py SCRIPT [ARGS...]     # runs a user's Keras Tuner script, observed

Self-contained (standard library + keras_tuner): `invoke tune` copies this file into each
run folder, so it also works next to a user's script that ships without the trainer package.

What it changes in Keras Tuner (1.4.x, keras_tuner/src/distribute/oracle_chief.py):
- ``start_server``, which the chief process runs instead of searching, is replaced by an
  equivalent that also emits ``oracle_ready``, ``trial_start`` and ``trial_end`` events, and
  checks for the end every 0.5 s instead of every 20 s.
- A search space without a tunable value, a bind failure, and a script that never calls
  ``tuner.search()`` end the process with one ``tune_error`` event naming the fix.
- ``oracle_client.TIMEOUT`` (60 min: a tuner waits that long for an unreachable oracle) becomes
  ``TFCLUSTER_ORACLE_TIMEOUT`` seconds (default 300).
"""

import json
import os
import runpy
import sys
import time

PREFIX = "TFCLUSTER_EVENT "  # Same protocol as trainer/events.py.
EXIT_TUNE_ERROR = 3
_searched = []


def emit(event: str, **fields) -> None:
    record = {"event": event, "time": round(time.time(), 3), **fields}
    sys.stdout.write(PREFIX + json.dumps(record, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def fail(message: str) -> None:
    """End the process with one line the launcher shows as the run's error."""
    emit("tune_error", message=message)
    raise SystemExit(EXIT_TUNE_ERROR)


def _trial_fields(oracle, trial) -> dict:
    score = getattr(trial, "score", None)
    message = (getattr(trial, "message", None) or "").strip().splitlines()
    return {"trial_id": trial.trial_id, "status": str(trial.status),
            "score": None if score is None else float(score),
            "hyperparameters": dict(trial.hyperparameters.values),
            "message": message[-1] if message else ""}


def _tunable(space) -> list:
    return [hp.name for hp in space if type(hp).__name__ != "Fixed"]


def _serve(oracle):
    """keras_tuner's start_server, observed (same servicer, same exit rule)."""
    from concurrent import futures

    import grpc
    from keras_tuner.src import protos
    from keras_tuner.src.distribute import oracle_chief

    override = os.environ.get("TFCLUSTER_MAX_TRIALS")
    if override:
        oracle.max_trials = int(override)
    space = oracle.get_space().space
    if not _tunable(space):
        names = ", ".join(hp.name for hp in space) or "none declared"
        fail(f"the search space has no tunable value (hyperparameters: {names}); declare at least one "
             "hp.Float/Int/Choice/Boolean in the hypermodel's build(), or stop pinning all of them")

    create_trial, end_trial = oracle.create_trial, oracle.end_trial

    def observed_create(tuner_id):
        trial = create_trial(tuner_id)
        if str(trial.status) == "RUNNING":
            emit("trial_start", tuner_id=tuner_id, **_trial_fields(oracle, trial))
        return trial

    def observed_end(trial):
        tuner_id = next((t for t, ongoing in oracle.ongoing_trials.items()
                         if ongoing.trial_id == trial.trial_id), None)
        result = end_trial(trial)
        emit("trial_end", tuner_id=tuner_id, **_trial_fields(oracle, oracle.trials[trial.trial_id]))
        return result

    oracle.create_trial, oracle.end_trial = observed_create, observed_end
    address, port = os.environ["KERASTUNER_ORACLE_IP"], os.environ["KERASTUNER_ORACLE_PORT"]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    servicer = oracle_chief.OracleServicer(oracle)
    protos.get_service_grpc().add_OracleServicer_to_server(servicer, server)
    try:
        bound = server.add_insecure_port(f"{address}:{port}")
    except RuntimeError:
        bound = 0
    if not bound:
        fail(f"the oracle cannot listen on {address}:{port} (port in use?); free it or choose "
             "another with --oracle-port")
    server.start()
    objective = oracle.objective
    emit("oracle_ready", address=address, port=int(port), max_trials=oracle.max_trials,
         objective=getattr(objective, "name", str(objective)),
         direction=getattr(objective, "direction", "min"), tunable=_tunable(space),
         project_dir=_absolute(oracle._project_dir),
         known=[_trial_fields(oracle, t) for t in oracle.trials.values()],
         ongoing={tuner: t.trial_id for tuner, t in oracle.ongoing_trials.items()})
    while not (servicer.stop_triggered and oracle_chief.exit_chief(oracle)):
        time.sleep(0.5)
    server.stop(grace=2)
    emit("oracle_done", trials=len(oracle.trials))


def _absolute(path: str) -> str:
    return path if "://" in path else os.path.abspath(path)


def install() -> None:
    """Patch Keras Tuner in this process (call before the script builds its tuner)."""
    from keras_tuner.src.distribute import oracle_chief, oracle_client
    from keras_tuner.src.engine import base_tuner

    oracle_chief.start_server = _serve
    oracle_client.TIMEOUT = float(os.environ.get("TFCLUSTER_ORACLE_TIMEOUT", "300"))
    search = base_tuner.BaseTuner.search

    def observed_search(self, *args, **kwargs):
        _searched.append(True)
        try:
            return search(self, *args, **kwargs)
        except Exception as error:  # grpc's RpcError when the oracle cannot be reached.
            if type(error).__name__ in ("_InactiveRpcError", "_MultiThreadedRendezvous") and \
                    "DEADLINE_EXCEEDED" in str(error):
                fail(f"this tuner could not reach the oracle at {os.environ.get('KERASTUNER_ORACLE_IP')}:"
                     f"{os.environ.get('KERASTUNER_ORACLE_PORT')} within {oracle_client.TIMEOUT:.0f} s; "
                     "open that port between the cluster's machines")
            raise

    base_tuner.BaseTuner.search = observed_search


def check_searched(what: str) -> None:
    if not _searched:
        fail(f"{what} finished without calling tuner.search(); a script for `invoke tune` builds a "
             "Keras Tuner tuner and calls its search() (see docs/tuning.md)")


def run_script(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: tune_hooks.py SCRIPT [ARGS...]")
    script = os.path.abspath(argv[0])
    install()
    sys.argv = [script, *argv[1:]]
    sys.path[0] = os.path.dirname(script)  # As `python SCRIPT` would.
    runpy.run_path(script, run_name="__main__")
    check_searched(os.path.basename(script))


if __name__ == "__main__":
    run_script(sys.argv[1:])
