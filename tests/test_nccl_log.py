"""What a run says about its all-reduce: NCCL's own INFO lines, TensorFlow's strategy line, and the
console that folds them. The NCCL transcripts are quoted from public issues where users pasted them
(each cited); host names and addresses are theirs."""

from __future__ import annotations

from tfcluster.collective import CollectiveWatch
from tfcluster.nccl import NcclInit, is_nccl_line
from tfcluster.tflog import StartupFold

# NVIDIA/nccl#1267 (https://github.com/NVIDIA/nccl/issues/1267): a GCP VM, NCCL 2.19.3, sockets on ens7.
GCP_SOCKET = """\
instance-8g-96c-3:2744870:2744870 [0] NCCL INFO Bootstrap : Using ens7:10.128.0.32<0>
instance-8g-96c-3:2744870:2744870 [0] NCCL INFO NET/Plugin: Failed to find ncclNetPlugin_v7 symbol.
instance-8g-96c-3:2744870:2744870 [0] NCCL INFO cudaDriverVersion 12000
NCCL version 2.19.3+cuda12.3
instance-8g-96c-3:2744870:2745046 [0] NCCL INFO NET/IB : No device found.
instance-8g-96c-3:2744870:2745046 [0] NCCL INFO NET/Socket : Using [0]ens7:10.128.0.32<0>
instance-8g-96c-3:2744870:2745046 [0] NCCL INFO Using non-device net plugin version 0
instance-8g-96c-3:2744870:2745046 [0] NCCL INFO Using network Socket
instance-8g-96c-3:2744870:2745046 [0] NCCL INFO Setting affinity for GPU 0 to ff,ffff0000,00ffffff"""

# NVIDIA/nccl#676 (https://github.com/NVIDIA/nccl/issues/676): NCCL_NET=Socket on a DGX A100, NCCL 2.11.4.
DGX_SOCKET = """\
gpu01:124172:124172 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to en
gpu01:124172:124172 [0] NCCL INFO Bootstrap : Using enp225s0f1:10.10.10.2<0>
gpu01:124172:124172 [0] NCCL INFO NET/Socket : Using [0]enp225s0f1:10.10.10.2<0>
gpu01:124172:124172 [0] NCCL INFO Using network Socket
NCCL version 2.11.4+cuda11.4"""

# NVIDIA/nccl#278 (https://github.com/NVIDIA/nccl/issues/278): two interfaces, NCCL 2.5.6.
TWO_INTERFACES = """\
sh-01:98911:98911 [0] NCCL INFO Bootstrap : Using [0]enP1p1s0f0:10.30.0.127<0> [1]enP1p1s0f1:10.30.0.227<0>
sh-01:98911:98911 [0] NCCL INFO NET/Socket : Using [0]enP1p1s0f0:10.30.0.127<0> [1]enP1p1s0f1:10.30.0.227<0>
sh-01:98911:98923 [3] NCCL INFO Ring 00 : 3[b01000] -> 4[201000] [send] via NET/Socket/0"""

# NVIDIA/nccl#1357 (https://github.com/NVIDIA/nccl/issues/1357): a net plugin loaded (IBext).
PLUGIN = """\
qh100-gpu19:49355:49414 [1] NCCL INFO Using network IBext
qh100-gpu20:39629:39686 [0] NCCL INFO NET/Plugin: Failed to find ncclNetPlugin_v8 symbol.
qh100-gpu20:39629:39686 [0] NCCL INFO NET/Plugin: Loaded net plugin NCCL RDMA Plugin v6 (v6)
qh100-gpu20:39629:39686 [0] NCCL INFO Plugin Path : /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so"""

# Google's GPUDirect-TCPX plugin registers its net as "GPUDirectTCPX_v7" (google/nccl-plugin-gpudirecttcpx,
# src/nccl_plugin.cc: ncclNetPlugin_v7 = {"GPUDirectTCPX_v7", ...}); NCCL names the net it took with
# "Using network %s" (NVIDIA/nccl src/init.cc), as the Socket transcripts above show for its own.
TCPX = """\
a3-vm-0:3301:3390 [0] NCCL INFO NET/Plugin: Loaded net plugin GPUDirectTCPX_v7 (v7)
a3-vm-0:3301:3390 [0] NCCL INFO Using network GPUDirectTCPX_v7"""

# TensorFlow 2.21's own lines (tensorflow/python/distribute/collective_all_reduce_strategy.py), as its
# `tensorflow` logger writes them with Python's BASIC_FORMAT.
TF_RING = ("INFO:tensorflow:MultiWorkerMirroredStrategy with cluster_spec = {'worker': ['10.0.0.2:2222', "
           "'10.0.0.3:2222']}, task_type = 'worker', task_id = 0, num_workers = 2, local_devices = "
           "('/job:worker/task:0/device:GPU:0',), communication = CommunicationImplementation.AUTO")
TF_CPU = ("INFO:tensorflow:Single-worker MultiWorkerMirroredStrategy with local_devices = "
          "('/job:localhost/replica:0/task:0/device:CPU:0',), communication = CommunicationImplementation.RING")
HEADER_GPUS = "=== tfcluster: worker-0 (chief:0) attempt 1 on vm-0, 2 GPUs (nvidia-smi) ==="


def _init(text: str) -> NcclInit:
    found = NcclInit()
    for line in text.splitlines():
        found.observe(line)
    return found


def test_nccl_names_its_version_network_and_interfaces_from_public_transcripts():
    assert _init(GCP_SOCKET).describe() == "NCCL 2.19.3, NET/Socket on ens7"
    assert _init(DGX_SOCKET).describe() == "NCCL 2.11.4, NET/Socket on enp225s0f1"
    two = _init(TWO_INTERFACES)
    assert two.interfaces == ["enP1p1s0f0", "enP1p1s0f1"] and two.describe() == \
        "NCCL, NET/Socket on enP1p1s0f0, enP1p1s0f1"
    plugin = _init(PLUGIN)
    assert (plugin.network, plugin.plugin) == ("IBext", "NCCL RDMA Plugin v6")
    assert plugin.describe() == "NCCL, NET/IBext"
    assert _init("NCCL version 2.27.7+cuda12.9\n" + TCPX).describe() == "NCCL 2.27.7, NET/GPUDirectTCPX"
    # "Failed to find ncclNetPlugin_v7 symbol" is not a plugin that loaded.
    assert _init(GCP_SOCKET).plugin == ""


def test_the_console_folds_nccl_and_tensorflow_info_lines_but_shows_nccl_warnings():
    fold = StartupFold()
    for line in [*GCP_SOCKET.splitlines(), TF_RING]:
        assert fold.hides(line), line
        assert is_nccl_line(line) or line is TF_RING
    warn = "node0:13571:13571 [0] NCCL WARN socketProgress: Connection closed by remote peer node2<42830>"
    assert not fold.hides(warn)  # NVIDIA/nccl#1232: an error the user must see.


def test_the_collective_row_says_nccl_and_its_transport_or_the_ring():
    watch = CollectiveWatch()
    for line in [HEADER_GPUS, "TFCLUSTER_EVENT {}", *GCP_SOCKET.splitlines()]:
        assert watch.line(0, "worker-0", line) is None
    assert watch.describe() == "NCCL 2.19.3, NET/Socket on ens7"

    cpu = CollectiveWatch()
    assert cpu.line(0, "worker-0", TF_CPU) is None  # No GPU on the host: nothing to warn about.
    assert cpu.describe() == "ring over gRPC (CPU)"
    # The bundled trainer's own event says it where TensorFlow's line is absent.
    assert CollectiveWatch().describe({"communication": "RING", "gpus": []}) == "ring over gRPC (CPU)"
    assert CollectiveWatch().describe({"communication": "NCCL", "gpus": ["NVIDIA L4"]}).startswith("NCCL (no NCCL line")
    assert CollectiveWatch().describe() == "n/a (no MultiWorkerMirroredStrategy line in the logs)"


def test_a_gpu_worker_on_the_ring_is_warned_once_per_run_with_the_fix():
    watch = CollectiveWatch()
    assert watch.line(1, "worker-1", HEADER_GPUS.replace("worker-0 (chief:0)", "worker-1 (worker:0)")) is None
    warning = watch.line(1, "worker-1", TF_RING)
    assert warning.startswith("worker-1 has 2 GPUs but its MultiWorkerMirroredStrategy all-reduces with "
                              "TensorFlow's ring (communication = AUTO")
    assert "CommunicationOptions(implementation=tf.distribute.experimental.CommunicationImplementation.NCCL)" in warning
    assert watch.describe() == "ring over gRPC (GPU: not NCCL)"
    watch.line(0, "worker-0", HEADER_GPUS)
    assert watch.line(0, "worker-0", TF_RING) is None  # Once per run.
    nccl = CollectiveWatch()
    nccl.line(0, "worker-0", HEADER_GPUS)
    assert nccl.line(0, "worker-0", TF_RING.replace("AUTO", "NCCL")) is None


def test_a_container_gets_the_wrappers_nccl_debug_on_gpu_hosts_and_the_users_value_wins(tmp_path):
    """`train --image`: docker reads the env file, not the wrapper's shell, so the NCCL_DEBUG and
    NCCL_DEBUG_SUBSYS the GPU probe exports must be passed by name (`--env NAME` takes the client's value),
    and only when set (an unset bare name can blank an image's ENV, docker/cli#1780). The wrapper's own lines run with the nvidia-smi stand-in and a `docker` that records
    what `docker run` got."""
    import shlex
    import subprocess

    from tests.world import nvidia_smi
    from tfcluster import container
    from tfcluster.collective import GPU_PROBE

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text('#!/bin/sh\nif [ "$1" = run ]; then printf "%s\\n" "$@" > "$OUT/args"; '
                      'echo "${NCCL_DEBUG-unset} ${NCCL_DEBUG_SUBSYS-unset}" > "$OUT/env"; fi\nexit 0\n')
    docker.chmod(0o755)
    nvidia_smi.install(tmp_path / "gpu", "nvidia-l4", count=2)
    start = container.wrapper_start(container.ContainerSpec("trainer:1"), "tfc-r-w0-a1", {}, "/tmp/env", "/tmp",
                                    str(tmp_path), ["python3", "task.py"], str(tmp_path / "log"), str(tmp_path / "pid"))
    for gpu, preset, seen in [(True, "", "INFO INIT,NET"), (False, "", "unset unset"),
                              (True, "export NCCL_DEBUG=WARN\n", "WARN INIT,NET")]:
        path = f"{bin_dir}:{tmp_path / 'gpu'}:/usr/bin:/bin" if gpu else f"{bin_dir}:/usr/bin:/bin"
        subprocess.run(["/bin/sh", "-c", preset + GPU_PROBE + start], check=True, timeout=30,
                       env={"PATH": path, "OUT": str(tmp_path)})
        args = (tmp_path / "args").read_text().splitlines()
        passed = ["NCCL_DEBUG", "NCCL_DEBUG_SUBSYS"] if gpu else []  # Unset on a CPU host: not passed.
        assert [args[i + 1] for i, arg in enumerate(args) if arg == "--env"] == [*passed, "HOME=/tmp"], \
            shlex.join(args)
        assert (tmp_path / "env").read_text().split() == seen.split(), (gpu, preset)
