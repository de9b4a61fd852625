"""SshBackend: bring-your-own hosts over SSH (up, preflight, stage, retry, collect, teardown).

Also the transport of the gcp backend, which subclasses it.
"""

from __future__ import annotations

import io
import shlex
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from tfcluster import gpu_health
from tfcluster.backends.base import Backend, Staged
from tfcluster.backends.group import in_parallel
from tfcluster.backends.ssh import watchdog
from tfcluster.backends.ssh.connection import HostAddress, HostKeyChanged, SshConnection, parse_hosts, pin_host_key
from tfcluster.backends.ssh.host import SshHost
from tfcluster.backends.ssh.mesh import check_tf_port_mesh
from tfcluster.backends.ssh.sync import collect_files, make_bundle, upload_bundle
from tfcluster.errors import ClusterError, ConfigError, HostErrors, HostUnreachable
from tfcluster.state import ClusterState, HostRecord


class SshBackend(Backend):
    """Workers on the user's own hosts: one worker per host entry, reached over SSH."""

    name = "ssh"
    hosts_outlive_cluster = True

    def __init__(self, store, announce: Callable[[str], None] = print):
        self._store = store
        self._announce = announce
        self._connections: dict[str, SshConnection] = {}

    # ------------------------------------------------------------ up

    def up(self, settings, existing):
        if existing is not None:
            return existing
        addresses = parse_hosts(settings.hosts)
        if not addresses:
            raise ConfigError("the ssh backend needs hosts: --hosts HOST[:PORT],... "
                              "(or tfcluster.hosts in invoke.yaml)")
        if settings.workers > len(addresses):
            raise ConfigError(f"workers must be between 1 and {len(addresses)}, the number of hosts given "
                              f"(got {settings.workers}); add hosts or lower --workers")
        addresses = addresses[:settings.workers]
        key_file = Path(settings.ssh_key).expanduser()
        if not key_file.is_file():
            raise ConfigError(f"ssh_key {settings.ssh_key} does not exist; pass --ssh-key PATH to the "
                              "private key that logs in to the hosts")
        known_hosts = Path(settings.known_hosts).expanduser()
        keys = in_parallel(addresses, lambda h: pin_host_key(h, known_hosts, settings.trust_new_hosts,
                                                             self._announce),
                           str, "verifying host keys")
        python = settings.python or "python3"
        records = []
        # Several workers may share one address: each gets its own TF port.
        seen: dict[str, int] = {}
        for index, (address, key) in enumerate(zip(addresses, keys)):
            offset = seen.get(address.address, 0)
            seen[address.address] = offset + 1
            records.append(HostRecord(name=f"worker-{index}", address=address.address,
                                      tf_port=settings.tf_port + offset, ssh_port=address.port, host_key=key))
        cluster = ClusterState(name=settings.cluster, backend=self.name, hosts=records,
                               ssh_user=settings.ssh_user, ssh_key=str(key_file), python=python)
        self._resolve_roots(cluster, settings.remote_dir)
        self.preflight(cluster, self.hosts(cluster), need_tensorflow=True, image=settings.image)
        if settings.install_watchdog:
            self.install_watchdog(cluster, settings.idle_minutes, settings.idle_action)
            self._announce(f"safety: idle watchdog halts each host after {settings.idle_minutes} idle minutes "
                           "(`invoke idle` changes it); own hosts have no hypervisor deadline; "
                           "`invoke down` stops everything")
        else:
            self._announce("safety: no idle watchdog on these hosts (add one with `invoke up --idle-minutes N`); "
                           "`invoke down` stops everything")
        return cluster

    def _resolve_roots(self, cluster, remote_dir: str) -> None:
        """Log in to every host and fix the absolute folder tfcluster owns there."""

        def resolve_root(record: HostRecord) -> str:
            connection = self._connection(cluster, record)
            code, out, err = connection.run("printf %s \"$HOME\"")
            home = out.strip()
            if code != 0 or not home.startswith("/"):
                raise ClusterError(f"cannot find the login's home folder: {err.strip()}")
            base = remote_dir if remote_dir.startswith("/") else f"{home}/{remote_dir}"
            return f"{base.rstrip('/')}/{cluster.name}"

        roots = in_parallel(cluster.hosts, resolve_root, lambda r: f"{r.name} ({r.address})", "logging in")
        for record, root in zip(cluster.hosts, roots):
            record.remote_root = root

    # ------------------------------------------------------------ hosts

    def _connection(self, cluster, record: HostRecord) -> SshConnection:
        key = f"{record.name}@{record.address}:{record.ssh_port}"
        if key not in self._connections:
            ssh_address = record.ssh_address or record.address
            self._connections[key] = SshConnection(
                f"{record.name} ({ssh_address})", HostAddress(ssh_address, record.ssh_port),
                cluster.ssh_user, cluster.ssh_key, record.host_key)
        return self._connections[key]

    def hosts(self, cluster) -> list[SshHost]:
        return [SshHost(record, self._connection(cluster, record), cluster.python) for record in cluster.hosts]

    def reachability(self, cluster) -> dict[str, str | None]:
        """One trivial command per host, all at once; a host that does not answer is marked
        broken, so every later call this process makes to it fails at once."""
        def probe(host: SshHost) -> str | None:
            try:
                host.connection.shell("true")
            except HostUnreachable as error:
                return f"unreachable ({error.detail})"
            except HostKeyChanged as error:  # Marked broken too: nothing more is sent to it.
                return error.detail
            return None

        hosts = self.hosts(cluster)
        with ThreadPoolExecutor(max_workers=min(32, len(hosts) or 1)) as pool:
            return dict(zip([h.record.name for h in hosts], pool.map(probe, hosts)))

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()

    # ------------------------------------------------------------ preflight

    def gpu_expectation(self, cluster) -> tuple[int | None, tuple[str, ...]]:
        """GPUs per host and the words of their model (tfcluster/gpu_health.py); own hosts declare none,
        so the host with the most GPUs and the commonest model set them."""
        return None, ()

    def preflight(self, cluster, hosts: list[SshHost], need_tensorflow: bool, image: str = "") -> None:
        # need_tensorflow: tf.keras resolves to tf_keras (TF_USE_LEGACY_KERAS=1), so check it too.
        modules = "tensorflow, tf_keras" if need_tensorflow else "tensorflow"
        # First, and cheap: hosts with an nvidia-smi have every GPU they should, each fit to train.
        gpu_health.require_healthy(hosts, *self.gpu_expectation(cluster))
        if image:  # Python and TensorFlow come from the image; the host needs Docker.
            from tfcluster.backends import docker

            docker.preflight(hosts, image, docker.required_modules(need_tensorflow), cluster.cluster_id)

        def check(host: SshHost) -> None:
            if image:
                code, err = 0, ""
            else:
                code, _, err = host.connection.run(
                    shlex.join([host.python, "-c", f"import {modules}"]), timeout=120)
            if code != 0:
                last = (err.strip().splitlines() or ["not found"])[-1]
                raise ClusterError(f"`{host.python} -c 'import {modules}'` failed ({last}); install them "
                                   "there (pip install tensorflow tf_keras) or set --python to an "
                                   "interpreter that has them")
            if host.port_in_use(host.record.tf_port):
                raise ClusterError(f"TensorFlow port {host.record.tf_port} is already in use; free it "
                                   "or choose another with --tf-port")

        in_parallel(hosts, check, lambda h: f"{h.record.name} ({h.record.address})", "preflight")
        check_tf_port_mesh(hosts)

    def require_modules(self, cluster, hosts: list[SshHost], modules: list[str]) -> None:
        def check(host: SshHost) -> None:
            code, _, err = host.connection.run(
                shlex.join([host.python, "-c", f"import {', '.join(modules)}"]), timeout=120)
            if code != 0:
                last = (err.strip().splitlines() or ["not found"])[-1]
                raise ClusterError(f"`{host.python} -c 'import {', '.join(modules)}'` failed ({last}); "
                                   f"install it there (pip install {' '.join(m.replace('_', '-') for m in modules)}) "
                                   "or set --python to an interpreter that has it")

        in_parallel(hosts, check, lambda h: f"{h.record.name} ({h.record.address})", "preflight")

    # ------------------------------------------------------------ staging

    def stage(self, cluster, hosts: list[SshHost], run_id: str, payload) -> Staged:
        from tfcluster.backends.local import PROJECT_ROOT

        if payload.script is None:
            code = make_bundle("code", PROJECT_ROOT, collect_files(PROJECT_ROOT / "trainer"))
            # collect_files gives paths under trainer/; keep them relative to the project root.
            argv = [payload.python, "-u", "-m", "trainer.task"]
        elif payload.project is not None:
            code = make_bundle("code", payload.project)
            argv = [payload.python, "-u", "{run_root}/code/" + payload.script.relative_to(payload.project).as_posix()]
        else:
            code = make_bundle("code", payload.script.parent, [payload.script])
            argv = [payload.python, "-u", "{run_root}/code/" + payload.script.name]
        data = make_bundle("data", payload.data_dir) if payload.data_dir is not None else None
        # What every worker gets beside its code: the tfcluster.progress helper and the sitecustomize
        # that dumps its stacks on SIGUSR1 when the run stalls (tfcluster/stall.py).
        support = make_bundle("worker", PROJECT_ROOT, [PROJECT_ROOT / "tfcluster" / "__init__.py",
                                                      PROJECT_ROOT / "tfcluster" / "workerpath" / "sitecustomize.py"])

        def stage_one(host: SshHost) -> bool:
            code_dir, code_new = upload_bundle(host, code)
            support_dir, _ = upload_bundle(host, support)
            links = [f"ln -sfn {shlex.quote(code_dir)} {shlex.quote(host.run_root(run_id) + '/code')}",
                     f"ln -sfn {shlex.quote(support_dir)} {shlex.quote(host.run_root(run_id) + '/worker')}"]
            data_new = False
            if data is not None:
                data_dir, data_new = upload_bundle(host, data)
                links.append(f"ln -sfn {shlex.quote(data_dir)} {shlex.quote(host.run_root(run_id) + '/data')}")
            links.insert(0, shlex.join(["mkdir", "-p", host.run_root(run_id) + "/output"]))
            status, out = host.connection.shell(" && ".join(links))
            if status != 0:
                raise ClusterError(f"linking code and data into the run folder failed: {out.strip()}")
            return code_new or data_new

        uploaded = in_parallel(hosts, stage_one, lambda h: f"{h.record.name} ({h.record.address})",
                               "uploading code and data")
        env = {"PYTHONPATH": "{run_root}/worker/tfcluster/workerpath:{run_root}/code:{run_root}/worker"}
        if data is not None:
            env["TFCLUSTER_DATA_DIR"] = "{run_root}/data"
        # code/ and data/ link into the cluster's folder: a container must see all of it.
        mounts = ["{remote_root}"]
        return Staged(argv=argv + list(payload.args), env=env, mounts=mounts,
                      uploaded={h.record.name: bool(u) for h, u in zip(hosts, uploaded)})

    # ------------------------------------------------------------ retries and results

    def before_retry(self, hosts: list[SshHost], run_id: str) -> None:
        """tf_keras restores every worker from <backup>/chief, which only the chief's host has.

        Each task keeps its host across attempts, so copying the chief's backup to the
        other hosts' run folders before a restart lets every worker resume the same epoch.
        """
        chief, others = hosts[0], hosts[1:]
        relative = "output/checkpoints/chief"
        sink = io.BytesIO()
        code, _, _ = chief.connection.run(
            f"cd {shlex.quote(chief.run_root(run_id))} && test -d {relative} && tar -czf - {relative}",
            timeout=300, sink=sink)
        if code != 0 or not others:
            return  # No checkpoint yet: every worker starts from epoch 1 together.
        archive = sink.getvalue()

        def copy(host: SshHost) -> None:
            root = host.run_root(run_id)
            host.write_file(f"{root}/checkpoint.tar.gz", archive, 0o600)
            status, _, err = host.connection.run(
                f"cd {shlex.quote(root)} && rm -rf {relative} && tar -xzf checkpoint.tar.gz && rm -f checkpoint.tar.gz")
            if status != 0:
                raise ClusterError(f"copying the chief's checkpoint failed: {err.strip()}")

        in_parallel(others, copy, lambda h: f"{h.record.name} ({h.record.address})",
                    "copying the chief's checkpoint")

    def collect(self, hosts: list[SshHost], run_id: str, local_run_dir: Path, succeeded: bool) -> str | None:
        local_run_dir.mkdir(parents=True, exist_ok=True)

        def fetch_log(host: SshHost) -> None:
            data = host.read_file(f"{host.run_root(run_id)}/{host.record.name}.log")
            if data is not None:
                (local_run_dir / f"{host.record.name}.log").write_bytes(data)

        try:
            in_parallel(hosts, fetch_log, lambda h: h.record.name, "fetching logs")
        except HostErrors as error:
            # Best effort: a lost host must not hide the run's own outcome.
            self._announce(f"some logs stay on their hosts: {error}")
        if not succeeded:
            return None
        chief = hosts[0]
        sink = io.BytesIO()
        code, _, err = chief.connection.run(
            f"cd {shlex.quote(chief.run_root(run_id))} && tar -czf - --exclude=output/checkpoints output",
            timeout=600, sink=sink)
        if code != 0:
            raise ClusterError(f"{chief.record.name}: fetching the model failed: {err.strip()}")
        sink.seek(0)
        with tarfile.open(fileobj=sink, mode="r:gz") as tar:
            tar.extractall(local_run_dir, filter="data")
        return str(local_run_dir / "output" / "model")

    def gather(self, hosts: list[SshHost], run_id: str, folder: str, local_run_dir: Path) -> None:
        """One tar stream per host; hosts[0] (the oracle's, with every trial.json) extracts last."""
        def fetch(host: SshHost) -> bytes | None:
            sink = io.BytesIO()
            code, _, err = host.connection.run(
                f"cd {shlex.quote(host.run_root(run_id))} && if [ -d {shlex.quote(folder)} ]; then "
                f"tar -czf - {shlex.quote(folder)}; fi", timeout=600, sink=sink)
            if code != 0:
                raise ClusterError(f"fetching {folder}/ failed: {err.strip()}")
            return sink.getvalue() or None

        archives = in_parallel(hosts, fetch, lambda h: f"{h.record.name} ({h.record.address})",
                               f"gathering {folder}/")
        local_run_dir.mkdir(parents=True, exist_ok=True)
        for archive in [*archives[1:], archives[0]]:
            if archive:
                with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
                    tar.extractall(local_run_dir, filter="data")

    # ------------------------------------------------------------ idle watchdog

    def install_watchdog(self, cluster, idle_minutes: int, action: str) -> None:
        from tfcluster.backends.local import PROJECT_ROOT

        package = PROJECT_ROOT / watchdog.WATCHDOG_SOURCE
        sources = {path.name: path.read_bytes() for path in sorted(package.glob("*.py"))}
        watchdog.install(self.hosts(cluster), cluster.cluster_id, sources, idle_minutes, action)

    def set_idle(self, cluster, idle_minutes: int, action: str) -> None:
        watchdog.change_settings(self.hosts(cluster), idle_minutes, action)

    def set_stall_minutes(self, cluster, stall_minutes: float | None) -> None:
        watchdog.set_stall_minutes(self.hosts(cluster), stall_minutes)

    def watchdog_status(self, cluster) -> dict[str, dict | None]:
        return watchdog.read_status(self.hosts(cluster))

    def hypervisor_deadlines(self, cluster) -> dict[str, float | None]:
        """Own hosts have no hypervisor deadline."""
        return {record.name: None for record in cluster.hosts}

    def refresh(self, cluster, settings) -> None:
        """`up` on an existing cluster: restore the configured idle settings (undoing `idle --off`)."""
        try:
            statuses = self.watchdog_status(cluster)
        except HostErrors:
            return
        if any(status is not None for status in statuses.values()):
            self.set_idle(cluster, settings.idle_minutes, settings.idle_action)

    def stop_watchdog(self, cluster) -> None:
        watchdog.stop(self.hosts(cluster))

    # ------------------------------------------------------------ down

    def _cluster_pids(self, host: SshHost, cluster) -> list[str]:
        marker = f"TFCLUSTER_CLUSTER_ID={cluster.cluster_id}"
        code, out, _ = host.connection.run(
            f"grep -l -a -x -z {shlex.quote(marker)} /proc/[0-9]*/environ 2>/dev/null; true")
        pids = [line.split("/")[2] for line in out.split() if line.startswith("/proc/")]
        return [pid for pid in pids if pid.isdigit()]

    def leftover_processes(self, cluster) -> list[str]:
        found = in_parallel(self.hosts(cluster), lambda h: [f"{h.record.name}: pid {p}" for p in self._cluster_pids(h, cluster)],
                            lambda h: h.record.name, "checking for leftover processes")
        return [item for items in found for item in items]

    def kill_leftovers(self, cluster) -> None:
        def kill(host: SshHost) -> None:
            pids = self._cluster_pids(host, cluster)
            if pids:
                host.connection.run(shlex.join(["kill", "-9", *pids]) + " 2>/dev/null; true")

        in_parallel(self.hosts(cluster), kill, lambda h: h.record.name, "killing leftover processes")

    def teardown(self, cluster, keep: bool, delete_bucket: bool = False) -> None:
        self.stop_watchdog(cluster)
        if keep:
            return

        def clean(host: SshHost) -> None:
            root = host.record.remote_root
            # Only ever the folder `up` created for this cluster: absolute, ends with its name.
            if not root.startswith("/") or not root.rstrip("/").endswith(f"/{cluster.name}") or root.count("/") < 3:
                raise ClusterError(f"refusing to delete suspicious folder {root!r}")
            host.connection.run(shlex.join(["rm", "-rf", "--", root]), timeout=120)

        in_parallel(self.hosts(cluster), clean, lambda h: f"{h.record.name} ({h.record.address})",
                    "removing run folders")
