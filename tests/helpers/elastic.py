"""An elastic torchrun job (``--nnodes=1:2``) of two agents on this machine, each agent a "node"
with its own state directory (read by that node's exporter), its rendezvous on c10d over
loopback; a node is lost by SIGKILLing its agent and workers, and the survivor's agent
re-rendezvouses alone and restarts its workers renumbered.

The rendezvous store is a process of its own (not hosted by the first agent, as torchrun does by
default): either agent can then be lost, the one whose worker is rank 0 too, which is what makes
the survivors renumber.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import psutil

from helpers.exporter_proc import child_env, free_port
from helpers.wait import wait_for

#: the rendezvous store: a TCPStore server on 127.0.0.1, for as long as it is not stopped
STORE = """
import sys, time
from datetime import timedelta
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, wait_for_workers=False,
                 multi_tenant=True, timeout=timedelta(seconds=300))
print("listening", flush=True)
while True:
    time.sleep(3600)
"""

#: a round completes 1 s after its minimum of nodes joined (30 s by default: the survivor would
#: wait that long alone); the store is not ours to host (the agents are clients of STORE)
RDZV_CONF = "is_host=0,last_call_timeout=1"


class ElasticJob:
    """Two torchrun agents of job ``job_id`` (``--rdzv-id``), agent *i* with state directory
    ``states[i]``, each running ``script`` with ``args`` in one worker."""

    def __init__(
        self, workdir: Path, script: Path, job_id: str, states: Sequence[Path], args: Sequence[str]
    ) -> None:
        self.workdir = workdir
        self.script = script
        self.logs: list[Path] = []
        self.agents: list[subprocess.Popen[bytes]] = []
        port = free_port()
        # a restarted group must not read the dead workers' addresses from the agent's shared
        # store: its init_process_group then hangs (pytorch/pytorch#135712, docs/integrations.md)
        env = child_env(
            {
                "GLOO_SOCKET_IFNAME": "lo",
                "OMP_NUM_THREADS": "1",
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            }
        )
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TRAINGUARD_JOB", "MASTER_PORT"):
            env.pop(name, None)
        for name in [n for n in env if n.startswith("SLURM_")]:  # run directly, not in Slurm
            del env[name]
        store_log = workdir / f"{job_id}-store.log"
        with store_log.open("wb") as out:
            self.store = subprocess.Popen(
                [sys.executable, "-c", STORE, str(port)], env=env, stdout=out, stderr=out
            )
        try:
            wait_for(
                lambda: b"listening" in store_log.read_bytes() or self._store_exited(store_log),
                120,
                0.1,
                "the rendezvous store to listen",
            )
            for i, state in enumerate(states):
                log = workdir / f"{job_id}-agent{i}.log"
                self.logs.append(log)
                with log.open("wb") as out:
                    self.agents.append(
                        subprocess.Popen(
                            [
                                sys.executable,
                                "-m",
                                "torch.distributed.run",
                                "--nnodes=1:2",
                                "--nproc-per-node=1",
                                "--max-restarts=3",
                                "--monitor-interval=0.2",
                                "--rdzv-backend=c10d",
                                f"--rdzv-endpoint=127.0.0.1:{port}",
                                f"--rdzv-id={job_id}",
                                f"--rdzv-conf={RDZV_CONF}",
                                str(script),
                                *args,
                            ],
                            env={**env, "TRAINGUARD_STATE_DIR": str(state)},
                            stdout=out,
                            stderr=subprocess.STDOUT,
                        )
                    )
        except BaseException:
            self.close()
            raise

    def _store_exited(self, log: Path) -> bool:
        if self.store.poll() is not None:
            raise RuntimeError(f"the rendezvous store exited: {log.read_text(errors='replace')}")
        return False

    def lose(self, agent: int) -> None:
        """Agent ``agent``'s node is lost: the agent and its workers SIGKILLed at once (each
        worker is a session of its own: torchrun starts them with ``start_new_session``)."""
        pid = self.agents[agent].pid
        for victim in [pid, *_children(pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        self.agents[agent].wait()

    def output(self) -> str:
        """The agents' logs, their start and end (for assertion messages)."""
        out = []
        for log in self.logs:
            text = log.read_text(errors="replace")
            out.append(f"--- {log.name}\n{text if len(text) < 6000 else text[:3000]}")
            if len(text) >= 6000:
                out.append(f"[...]\n{text[-3000:]}")
        return "\n".join(out)

    def close(self) -> None:
        """Stop the agents (SIGTERM: torchrun stops its workers), then the store."""
        workers = [child for agent in self.agents for child in _children(agent.pid)]
        for agent in self.agents:
            if agent.poll() is None:
                agent.terminate()
        for agent in self.agents:
            try:
                agent.wait(30)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
        for worker in workers:  # any the agents left behind (still running the script)
            with contextlib.suppress(OSError):
                if str(self.script).encode() in Path(f"/proc/{worker}/cmdline").read_bytes():
                    os.kill(worker, signal.SIGKILL)
        self.store.kill()
        self.store.wait()


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (none once it is gone)."""
    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except psutil.Error:
        return []
