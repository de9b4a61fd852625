"""The live console folds TensorFlow's start-up noise; the logs and `invoke logs` keep every line."""

from __future__ import annotations

import re

from tfcluster import tflog

# A worker's log from a real 3-worker run on this machine (TF 2.21, CPU only, TF_CPP_MIN_LOG_LEVEL unset).
REAL_LOG = """\
=== tfcluster: worker-1 (worker:0) attempt 1 on vm ===
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1795357008.749365    9100 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results due to floating-point round-off errors from different computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.
I0000 00:00:1795357008.749779    9100 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
I0000 00:00:1795357008.850964    9100 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use available CPU instructions in performance-critical operations.
To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1795357011.444269    9100 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results due to floating-point round-off errors from different computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.
I0000 00:00:1795357011.444981    9100 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
E0000 00:00:1795357011.667462    9100 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)
I0000 00:00:1795357011.674909    9100 grpc_server_lib.cc:467] Started server with target: grpc://127.0.0.1:54393
I0000 00:00:1795357011.751758    9224 coordination_service.cc:505] Example stragglers:
/job:worker/replica:0/task:0
I0000 00:00:1795357012.779569    9100 coordination_service_agent.cc:245] Coordination agent has successfully connected.
replicas in sync: 3
I0000 00:00:1795357013.755275    9100 generator_dataset_op.cc:213] Memory patch applied: M_TRIM_THRESHOLD=128 kb was set.
W0000 00:00:1795357013.761185    9100 dataset.cc:997] Input of GeneratorDatasetOp::Dataset will not be optimized because the dataset does not implement the AsGraphDefInternal() method needed to apply optimizations.
Epoch 1/2
4/4 - 1s - loss: 0.7251 - accuracy: 0.4583 - 1s/epoch - 263ms/step
fit done, loss 0.7212
"""
SHOWN = ["=== tfcluster: worker-1 (worker:0) attempt 1 on vm ===", "replicas in sync: 3", "Epoch 1/2",
         "4/4 - 1s - loss: 0.7251 - accuracy: 0.4583 - 1s/epoch - 263ms/step", "fit done, loss 0.7212"]


def test_real_start_up_noise_folds_and_the_run_stays():
    fold = tflog.StartupFold()
    shown = [line for line in REAL_LOG.splitlines() if not fold.hides(line)]
    assert shown == SHOWN
    assert fold.summary() == "TensorFlow started, CPU only (15 start-up lines in the log)"


def test_other_errors_fatals_warnings_and_tracebacks_are_always_shown():
    fold = tflog.StartupFold()
    for line in [
        "E0000 00:00:1795357011.667462    9100 collective_ops_utils.cc:80] Collective op aborted: peer down",
        "F0000 00:00:1795357011.667462    9100 gpu_device.cc:99] Check failed: device",
        "W0000 00:00:1795357013.761185    9100 grpc_worker.cc:120] Deadline exceeded talking to worker:1",
        "Traceback (most recent call last):",
        "/job:worker/replica:0/task:0",  # Looks like a continuation, but no noise came before it.
        "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow",
    ]:
        assert not fold.hides(line), line
    assert fold.hidden == 0


def test_gpu_devices_are_named_in_the_fold_line():
    # Format printed by tensorflow/core/common_runtime/gpu/gpu_device.cc when it creates a device.
    fold = tflog.StartupFold()
    for index in (0, 1):
        assert fold.hides(f"I0000 00:00:1795357011.444981    9100 gpu_device.cc:2020] Created device "
                          f"/job:worker/replica:0/task:0/device:GPU:{index} with 13949 MB memory:  -> device: "
                          f"{index}, name: Tesla T4, pci bus id: 0000:00:0{4 + index}.0, compute capability: 7.5")
    assert fold.summary() == "TensorFlow started, 2 GPUs (Tesla T4) (2 start-up lines in the log)"


def test_keras_20585_is_diagnosed_with_the_fix_for_each_keras_setting():
    log = ["Traceback (most recent call last):", "ValueError: Attempt to convert a value (PerReplica:{",
           "}) with an unsupported type (<class 'tensorflow.python.distribute.values.PerReplica'>) to a Tensor."]
    assert "--keras 2" in tflog.diagnose(log, "3")
    assert "import tf_keras as keras" in tflog.diagnose(log, "2")  # The script imported Keras 3 itself.
    assert tflog.diagnose(log[:1] + ["ValueError: bad shape"], "3") is None


CPP_IN_CONSOLE = re.compile(r"│ ([IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\]|WARNING: All log messages before absl|"
                            r"To enable the following instructions)")


def assert_console_folds_tensorflow_noise_and_logs_keep_it(cli, console: str, workers: int) -> None:
    """The quick start's console shows no TensorFlow C++ line, one folded line per worker; `invoke logs`
    shows what `train` showed, and `invoke logs --raw` every folded line and every event (tests/
    test_e2e_local.py runs the quick start)."""
    assert CPP_IN_CONSOLE.search(console) is None, console
    folded = re.findall(r"^(worker-\d) +│ TensorFlow started, CPU only \((\d+) start-up lines in the log\)$",
                        console, re.M)
    assert sorted(name for name, _ in folded) == [f"worker-{index}" for index in range(workers)], console
    assert f"{workers} replicas in sync" in console and "validation accuracy" in console

    logs = cli.run("logs").stdout
    assert CPP_IN_CONSOLE.search(logs) is None and "TFCLUSTER_EVENT" not in logs, logs[-3000:]
    assert re.findall(r"^(worker-\d) +│ TensorFlow started, CPU only", logs, re.M) == [name for name, _ in sorted(folded)]
    epochs = re.findall(r"^worker-0 +│ epoch \d/\d  .*$", console, re.M)
    assert epochs and re.findall(r"^worker-0 +│ epoch \d/\d  .*$", logs, re.M) == epochs, (epochs, logs[-3000:])
    raw = cli.run("logs", "--raw").stdout
    assert raw.count("TFCLUSTER_EVENT") > 10
    for worker, count in folded:
        lines = re.findall(rf"^{worker} +│ (.*)$", raw, re.M)
        noise = [line for line in lines if CPP_IN_CONSOLE.search("│ " + line) or line.startswith("/job:")]
        assert any("failed call to cuInit" in line for line in noise), (worker, lines)
        assert len(noise) >= int(count) > 5  # Every folded line is in the log.


def test_a_table_never_breaks_a_path_and_still_wraps_prose(monkeypatch):
    """On a narrow terminal a table is drawn as wide as its longest word (the terminal wraps the line
    as it is, and a copy gives the whole path); text with spaces wraps at them."""
    from tfcluster import ui

    monkeypatch.setattr(ui.console, "width", 60)
    path = "/home/me/.local/state/tfcluster/runs/default/default-20261126-114538-f173/output/model/model.keras"
    table = ui.table("Run default-20261126-114538-f173: succeeded", ["", ""])
    table.add_row("model", path)
    table.add_row("cost", "0.01 VM-hours, 0.00 stopped-disk hours (own hosts: no prices), and enough more words "
                          "to be longer than the path, so they wrap")
    with ui.console.capture() as captured:
        ui.show(table)
    lines = captured.get().splitlines()
    assert any(path in line for line in lines), lines
    assert max(len(line) for line in lines) == len(path) + len("│ model │  │"), lines  # As wide as the path needs.
    assert not any("so they wrap" in line for line in lines if "0.01 VM-hours" in line), lines  # The prose wrapped.


def test_tensorboard_prints_no_tensorflow_cpp_line(tmp_path):
    """Issue 47: `tensorboard` printed TensorFlow's C++ start-up lines (TF 2.21 ignores
    TF_CPP_MIN_LOG_LEVEL for them); they are folded as `train` folds them, and Ctrl-C ends it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests import labnet
    from tests.conftest import REPO

    port = labnet.free_ports(1)[0]
    code = f"from tfcluster.commands.results import serve_tensorboard; serve_tensorboard({str(tmp_path)!r}, {port})"
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    served = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(f"localhost:{port}" in line for line in lines):
            line = served.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
        assert any(f"at http://localhost:{port}/" in line for line in lines), lines
    finally:
        served.send_signal(signal.SIGINT)
        lines += served.communicate(timeout=30)[0].splitlines()
    cpp = re.compile(r"^([IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\]|WARNING: All log messages before absl)")
    assert [line for line in lines if cpp.match(line)] == [], lines
    assert served.returncode in (0, -2, 130), lines


# A tf_keras progress bar as a script's worker logs it (not a terminal, but tf_keras redraws anyway:
# "posix" in sys.modules): every redraw on one line, joined by backspaces and carriage returns.
KERAS_BAR = ("\r1/4 [======>.......................] - ETA: 3s - loss: 1.3863 - accuracy: 0.2188"
             + "\b" * 70 + "\r4/4 [==============================] - 1s 263ms/step - loss: 0.7251 - accuracy: 0.4583")


def test_a_scripts_keras_bar_shows_once_as_its_final_state():
    """Issue 47: each worker's Keras bar appeared three times, squashed into one line per epoch."""
    from types import SimpleNamespace

    from tfcluster import ui
    from tfcluster.commands import run_view

    plans = [SimpleNamespace(index=index, name=f"worker-{index}") for index in range(3)]
    view = run_view.RunView(plans)
    with ui.console.capture() as captured:
        for plan in plans:
            view.line(plan, "Epoch 1/2")
            view.line(plan, KERAS_BAR)
    shown = captured.get().splitlines()
    assert [line for line in shown if "[====" in line] == [
        "worker-0 │ 4/4 [==============================] - 1s 263ms/step - loss: 0.7251 - accuracy: 0.4583"]
    assert "\b" not in captured.get() and "\r" not in captured.get()
    assert view.bars_line() == "Keras: w0 4/4 · w1 4/4 · w2 4/4"
