"""A real Slurm cluster on this machine: Debian's slurmctld and several slurmd (one per node name,
``slurmd -N n1``), authenticated by a munged of its own, everything on 127.0.0.1.

Why real: what trainguard must get right on Slurm is what Slurm does, not what we think it does
(``SLURM_RESTART_COUNT`` after ``scontrol requeue``, the same ``SLURM_JOB_ID``, which processes
a ``scancel --signal`` reaches, the order a requeue stops and starts the ranks in). Every file
the cluster needs (slurm.conf, munge key and socket, state, spool and logs) lives under the
test's directory and every port is its own, so that two pytest workers can each run one. It
runs as root (SlurmUser=root), ``proctrack/linuxproc`` and ``task/none``: no cgroups, no
accounting daemon. A cluster that cannot start raises with the reason (which binary, what it
logged), never skips.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil

from helpers.exporter_proc import free_port
from helpers.wait import WaitTimeout, wait_for

#: the binaries the cluster needs, and the Debian package of each
BINARIES = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    "scontrol": "slurm-client",
    "sinfo": "slurm-client",
    "squeue": "slurm-client",
    "scancel": "slurm-client",
}
INSTALL = "apt-get install -y --no-install-recommends slurm-wlm munge"


class SlurmError(RuntimeError):
    """The cluster could not start or a Slurm command failed; the message has its logs."""


def missing_binaries() -> list[str]:
    """The binaries of :data:`BINARIES` not on PATH (nor in /usr/sbin), with their packages."""
    return [
        f"{name} (package {package})" for name, package in BINARIES.items() if _which(name) is None
    ]


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")


def _slurm_conf(
    root: Path, host: str, nodes: Sequence[tuple[str, int]], ctld_port: int, cpus: int
) -> str:
    lines = [
        f"ClusterName=tg{ctld_port}",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire also holds a requeued job back before it may start again (default 120 s)
        f"AuthInfo=socket={root}/munge/socket,cred_expire=5",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/run/slurmctld.pid",
        f"SlurmdPidFile={root}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        # each node's CPUs as configured, though the nodes share this machine's cores: room for
        # several 2-node jobs side by side
        "SlurmdParameters=config_overrides",
        "SchedulerType=sched/builtin",
        # a requeued job waits for the periodic pass (60 s by default) once its hold is over
        "SchedulerParameters=sched_interval=1",
        "ReturnToService=2",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        # SIGTERM to SIGKILL when a job is cancelled or requeued
        "KillWait=5",
        "MinJobAge=600",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
    ]
    for name, port in nodes:
        lines.append(
            f"NodeName={name} NodeAddr=127.0.0.1 NodeHostname={host} Port={port} "
            f"CPUs={cpus} State=UNKNOWN"
        )
    names = ",".join(name for name, _ in nodes)
    lines.append(f"PartitionName=tg Nodes={names} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


class SlurmCluster:
    """slurmctld, ``nodes`` slurmd named n1..nN and munged, under ``workdir`` (``workdir/slurm``).

    ``env`` is what Slurm's commands need (``SLURM_CONF``); :meth:`command` runs one of them.
    """

    def __init__(self, workdir: Path, nodes: int = 3, cpus: int = 2, timeout: float = 90) -> None:
        missing = missing_binaries()
        if missing:
            raise SlurmError(
                f"cannot start a Slurm cluster: not installed: {', '.join(missing)}; "
                f"install them with `{INSTALL}` (./run-tests and .ci/run do as root)"
            )
        if os.geteuid() != 0:
            raise SlurmError(
                "cannot start a Slurm cluster: slurmd must run as root (SlurmdUser=root) to "
                f"start the tasks; run the tests as root (uid is {os.geteuid()})"
            )
        self.root = workdir / "slurm"
        self.nodes = [f"n{i}" for i in range(1, nodes + 1)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        for sub in (
            "munge",
            "munge-key",
            "state",
            "run",
            "log",
            *(f"spool/{n}" for n in self.nodes),
        ):
            (self.root / sub).mkdir(parents=True)
        os.chmod(self.root / "munge", 0o755)
        os.chmod(self.root / "munge-key", 0o700)
        key = self.root / "munge-key" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        ctld_port = free_port()
        node_ports = [(name, free_port()) for name in self.nodes]
        self.conf = self.root / "slurm.conf"
        self.conf.write_text(
            _slurm_conf(self.root, socket.gethostname(), node_ports, ctld_port, cpus)
        )
        self.env = {"SLURM_CONF": str(self.conf)}
        try:
            self._start(key, timeout)
        except BaseException:
            self.close()
            raise

    def _daemon(self, name: str, argv: list[str]) -> None:
        out = (self.root / "log" / f"{name}.out").open("wb")
        try:
            self.procs[name] = subprocess.Popen(
                argv,
                env={**os.environ, **self.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.root,
            )
        finally:
            out.close()

    def _start(self, key: Path, timeout: float) -> None:
        sock = self.root / "munge" / "socket"
        self._daemon(
            "munged",
            [
                str(_which("munged")),
                "--foreground",
                "--force",  # root, and a key under /tmp
                f"--socket={sock}",
                f"--key-file={key}",
                f"--pid-file={self.root}/run/munged.pid",
                f"--log-file={self.root}/log/munged.log",
                f"--seed-file={self.root}/run/munged.seed",
            ],
        )
        self._wait(lambda: sock.exists(), timeout, "munged's socket")
        self._daemon("slurmctld", [str(_which("slurmctld")), "-D", "-i", "-f", str(self.conf)])
        self._wait(
            lambda: self.command("scontrol", "ping", check=False).returncode == 0,
            timeout,
            "slurmctld to answer `scontrol ping`",
        )
        for node in self.nodes:
            self._daemon(
                f"slurmd-{node}", [str(_which("slurmd")), "-D", "-N", node, "-f", str(self.conf)]
            )
        self._wait(self._all_idle, timeout, f"sinfo to show {', '.join(self.nodes)} idle")

    def _all_idle(self) -> bool:
        out = self.command("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout
        states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
        return all(states.get(node) == "idle" for node in self.nodes)

    def _wait(self, ok: object, timeout: float, what: str) -> None:
        def ready() -> bool:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise SlurmError(
                        f"{name} exited with {proc.returncode} while waiting for {what}\n"
                        f"{self.logs(first=name)}"
                    )
            return bool(ok())  # type: ignore[operator]

        try:
            wait_for(ready, timeout, 0.1, what)
        except WaitTimeout as exc:
            raise SlurmError(f"{exc}\n{self.logs()}") from None

    def command(
        self, *argv: str, check: bool = True, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command against this cluster; with ``check``, a failure raises with
        what it said and the daemons' logs."""
        cmd = [str(_which(argv[0]) or argv[0]), *argv[1:]]
        result = subprocess.run(
            cmd,
            env={**os.environ, **(env or {}), **self.env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and result.returncode != 0:
            raise SlurmError(
                f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}\n"
                f"{self.logs()}"
            )
        return result

    def sbatch(
        self,
        script: Path,
        options: Sequence[str] = (),
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Submit ``script`` with sbatch's ``options`` and the script's ``args``; the job id."""
        out = self.command("sbatch", "--parsable", *options, str(script), *args, env=env).stdout
        return out.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, RestartCnt, NodeList, BatchHost...)."""
        out = self.command("scontrol", "show", "job", "-o", job_id).stdout
        fields: dict[str, str] = {}
        for word in out.split():
            key, _, value = word.partition("=")
            fields.setdefault(key, value)
        return fields

    def wait_job(
        self,
        job_id: str,
        states: Sequence[str],
        timeout: float = 120,
        until: Callable[[dict[str, str]], bool] | None = None,
    ) -> dict[str, str]:
        """Wait until the job's JobState is one of ``states`` (and ``until`` holds of its
        fields); return its fields."""
        last: dict[str, dict[str, str]] = {}

        def reached() -> dict[str, str] | None:
            fields = last["job"] = self.job(job_id)
            if fields.get("JobState") in states and (until is None or until(fields)):
                return fields
            return None

        try:
            return wait_for(reached, timeout, 0.2, f"job {job_id} to be {'/'.join(states)}")
        except WaitTimeout as exc:
            raise SlurmError(f"{exc}\n{last.get('job')}\n{self.logs()}") from None

    def logs(self, tail: int = 3000, first: str | None = None) -> str:
        """The tails of every daemon's output (``first``'s first), for failure messages."""
        paths = sorted((self.root / "log").glob("*.out"), key=lambda p: (p.stem != first, p.name))
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}" for path in paths
        )

    def lose_node(self, node: str) -> list[int]:
        """The node is lost, as when it loses power: its slurmd and every process of this
        cluster's jobs on it (the tasks, by ``SLURMD_NODENAME`` in their environment, and the
        slurmstepd above each) SIGKILLed at once; the pids killed."""
        tasks = [
            pid
            for pid in self._job_processes()
            if f"SLURMD_NODENAME={node}".encode() in _environ(pid)
        ]
        steps = {
            parent
            for parent in map(_parent, tasks)
            if parent and _cmdline(parent).startswith(b"slurmstepd")
        }
        victims = [self.procs[f"slurmd-{node}"].pid, *steps, *tasks]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.procs[f"slurmd-{node}"].wait()
        return victims

    def _job_processes(self) -> list[int]:
        """Pids of this cluster's job processes: slurmstepd and the tasks, found by the
        SLURM_CONF in their environment (slurmstepd detaches from slurmd, so stopping the
        daemons leaves them running), not the daemons' own helpers (slurmscriptd)."""
        mine = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if mine not in environ:
                continue
            if cmdline.startswith(b"slurmstepd") or any(
                var.startswith(b"SLURM_JOB_ID=") for var in environ
            ):
                found.append(int(entry.name))
        return found

    def close(self) -> None:
        """Cancel every job, end the job processes, stop the daemons and wait for them."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.command("scancel", "--full", "--user=root", check=False)
            with contextlib.suppress(WaitTimeout):
                wait_for(lambda: not self._job_processes(), 30, 0.2, "the jobs to end")
        for pid in self._job_processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for name in [*(n for n in self.procs if n.startswith("slurmd-")), "slurmctld", "munged"]:
            proc = self.procs.get(name)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        with contextlib.suppress(WaitTimeout):  # SIGKILLed above: the kernel's reaping is left
            wait_for(lambda: not self._job_processes(), 30, 0.1, "the job processes to go")

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _parent(pid: int) -> int | None:
    """The parent's pid (None once it is gone)."""
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return None
