"""A private single-node SLURM cluster for tests: one munged, one slurmctld, one slurmd, all under one folder.

    cluster = SlurmCluster(tmp / "slurm"); cluster.start()   # a few seconds; raises ClusterUnavailable with why
    cluster.run(["sbatch", "job.sh"]); cluster.env           # SLURM_CONF for every client command
    cluster.stop()                                           # every process it started, by pid

Nothing is shared with the machine's own SLURM or munge: the cluster has its own slurm.conf, state and spool
folders, free TCP ports, a munge key and socket of its own, and log files beside them (kept for a failing test to
read). What it needs of the machine: the Debian packages `slurm-wlm` and `munge` (`apt-get install -y slurm-wlm
munge`) and root (slurmd starts each job step as the job's user). The same cluster is what docs/scaling-out.md
starts by hand ("Try it on one machine"): `python tests/slurm_cluster.py DIR` prints the SLURM_CONF to export.

Settings chosen for a test machine, each with its reason:
- `ProctrackType=proctrack/linuxproc`, `TaskPlugin=task/none`: no cgroup hierarchy is needed (containers, CI).
- `SelectType=select/cons_tres` with `CR_CPU`: one CPU per array task, so as many tasks run at once as the machine
  has CPUs (`CPUs=` is this machine's count; `SlurmdParameters=config_overrides` takes it as configured).
- `AuthInfo=cred_expire=10`: a requeued job waits `cred_expire` seconds before it may start again (SLURM's
  default, 120 s, would make each requeue test wait two minutes); `KillWait=10`: a stopped step gets 10 s between
  SIGTERM and SIGKILL to save (30 s by default).
- `MinJobAge=600`: a finished job stays visible to `scontrol` / `squeue` for 10 minutes (the sweep's status reads
  the scheduler without accounting).
- `SchedulerParameters=sched_interval=2` and `bf_interval=2`: a job whose dependency is met starts within seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scontrol", "squeue", "scancel")
INSTALL_HINT = (
    "the SLURM tests need a single-node SLURM: install Debian's packages as root with "
    "`apt-get update && apt-get install -y slurm-wlm munge` (.ci/run does this in CI), then run them again"
)


class ClusterUnavailable(RuntimeError):
    """The cluster cannot start here (binaries absent, not root, a daemon that did not come up): the reason."""


def binary(name: str) -> str | None:
    """The path of a SLURM or munge program (daemons live in /usr/sbin, which a user's PATH may lack)."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/local/sbin")


def missing_reason() -> str | None:
    """Why no cluster can start on this machine (None when it can)."""
    missing = [name for name in DAEMONS + CLIENTS if binary(name) is None]
    if missing:
        return f"{', '.join(missing)} not found: {INSTALL_HINT}"
    if os.geteuid() != 0:
        return "the private SLURM cluster's slurmd must run as root (it starts each job step as the job's user)"
    return None


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class SlurmCluster:
    """One munged + slurmctld + slurmd under `root` (module docstring)."""

    def __init__(self, root: Path, cpus: int | None = None) -> None:
        self.root = Path(root).resolve()
        self.cpus = cpus or os.cpu_count() or 1
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.env["PATH"] = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])

    # ------------------------------------------------------------------------------------------- start / stop
    def start(self, timeout: float = 60.0) -> SlurmCluster:
        reason = missing_reason()
        if reason:
            raise ClusterUnavailable(reason)
        try:
            self._start_munge()
            self._write_conf()
            self._daemon("slurmctld", [binary("slurmctld"), "-D", "-f", str(self.conf)], "slurmctld.log")
            self._wait(lambda: self.run(["scontrol", "ping"], check=False).stdout.count("UP") > 0, "slurmctld", timeout)
            self._daemon("slurmd", [binary("slurmd"), "-D", "-f", str(self.conf), "-N", self.node], "slurmd.log")
            self._wait(self._node_idle, "slurmd (the node to be idle)", timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self) -> None:
        folder = self.munge_socket.parent
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o700)
        key = folder / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))  # a key of its own: no other munged can read its credentials
        key.chmod(0o600)
        cmd = [
            binary("munged"),
            "--foreground",
            "--force",  # root, and the key's folder under a tmp dir: munged's ownership checks would refuse both
            f"--socket={self.munge_socket}",
            f"--key-file={key}",
            f"--pid-file={folder / 'munged.pid'}",
            f"--log-file={folder / 'munged.log'}",
            f"--seed-file={folder / 'munged.seed'}",
            "--num-threads=2",
        ]
        self._daemon("munged", cmd, "munge/munged.out")
        self._wait(self.munge_socket.exists, "munged (its socket)", 20)

    def _write_conf(self) -> None:
        for folder in ("state", "spool", "log"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        ctld_port, slurmd_port = _free_ports(2)
        lines = [
            f"ClusterName=cqk{os.getpid()}",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log' / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket},cred_expire=10",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=2,bf_interval=2",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SlurmdParameters=config_overrides",
            "KillWait=10",
            "MinJobAge=600",
            "InactiveLimit=0",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _daemon(self, name: str, cmd: list[str], log: str) -> None:
        out = open(self.root / log, "ab")  # noqa: SIM115 (the daemon holds it; closed with this process)
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        out.close()
        self.procs[name] = proc

    def _wait(self, ready, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise ClusterUnavailable(f"{name} exited with {proc.returncode} while starting: {self.logs()}")
            if ready():
                return
            time.sleep(0.3)
        raise ClusterUnavailable(f"{what} did not come up within {timeout:.0f} s: {self.logs()}")

    def _node_idle(self) -> bool:
        out = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False).stdout.strip()
        return out.startswith("idle")

    def stop(self) -> None:
        """End every process this cluster started: its jobs first (scancel), then slurmd, slurmctld, munged, each by
        its own pid and process group (a job step's processes are slurmd's children; they go with it)."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run(["scancel", "--full", "--quiet", "-u", "root"], check=False)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            except ProcessLookupError:
                pass
        self._kill_stragglers()

    def _kill_stragglers(self) -> None:
        """Processes of this cluster left after slurmd's end (a slurmstepd or a job's process, each in a session of
        its own): found by /proc, never by a broad name, and killed by pid."""
        for pid in self.leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def leftovers(self) -> list[int]:
        """Live processes that belong to this cluster: their command line or environment names its folder (the
        daemons name their config; every job process has SLURM_CONF in its environment)."""
        mine = str(self.root).encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # a zombie: already ended, waiting for its parent
                if mine in (entry / "cmdline").read_bytes() or mine in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except (OSError, IndexError):
                continue
        return found

    # ------------------------------------------------------------------------------------------- clients
    def run(self, cmd: list[str], check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        """A SLURM client command against this cluster (SLURM_CONF set), its output captured as text."""
        kwargs.setdefault("env", self.env)
        kwargs.setdefault("timeout", 60)
        result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {result.returncode}: {result.stderr.strip()}")
        return result

    def logs(self, tail: int = 2000) -> str:
        """The tails of the daemons' logs (what a failing start or test shows)."""
        parts = []
        for path in (
            self.root / "munge" / "munged.log",
            self.root / "log" / "slurmctld.log",
            self.root / "log" / "slurmd.log",
        ):
            if path.is_file():
                parts.append(f"--- {path}\n{path.read_text(errors='replace')[-tail:]}")
        for name in ("munge/munged.out", "slurmctld.log", "slurmd.log"):
            path = self.root / name
            if path.is_file() and path.stat().st_size:
                parts.append(f"--- {path}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts) or "(no logs)"

    def job_state(self, job: str) -> str:
        """`JobState` of a job (`<array job>_<task>` for one array task) as `scontrol show job` gives it."""
        out = self.run(["scontrol", "-o", "show", "job", job], check=False).stdout
        for field in out.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return "UNKNOWN"


if __name__ == "__main__":  # docs/scaling-out.md: start the same cluster by hand, stop it with Ctrl-C
    cluster = SlurmCluster(Path(sys.argv[1] if len(sys.argv) > 1 else "slurm-local")).start()
    print(f"cluster up: export SLURM_CONF={cluster.conf}   (Ctrl-C stops it)", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
