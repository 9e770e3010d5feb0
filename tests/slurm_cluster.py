"""A real one-node SLURM cluster for the tests: munged, slurmctld and slurmd of Debian's packages
(`apt-get install slurmctld slurmd slurm-client munge`; .ci/run installs them), started as
background processes with their own key, config, ports and state in a temporary directory
(SLURM_CONF names it), and stopped by process id at the end of the session. Each test that asks
for the cluster leaves its queue empty, so a test that fails with a job still queued or running
fails alone, not every SLURM test after it. Jobs run as the user running the tests; with no
accounting database (slurmdbd), sacct knows no jobs, so sweep.py reads SLURM's state from squeue
alone."""

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass

import pytest


@dataclass
class Cluster:
    env: dict  # SLURM_CONF (and PATH) for sbatch, squeue and sweep.py
    directory: str
    user: str  # the jobs' owner: the user running the tests

    def command(self, *args, check=True, timeout=60):
        """Run a SLURM client command (scontrol, squeue, scancel) against this cluster; its stdout."""
        return subprocess.run(args, env={**os.environ, **self.env}, check=check, capture_output=True, text=True,
                              timeout=timeout).stdout

    def scontrol(self, *args):
        self.command("scontrol", *args)

    def queue(self):
        """squeue's lines ("JOBID STATE") for every job of the cluster; [] when the queue is empty."""
        return self.command("squeue", "--noheader", "--format=%i %T").splitlines()

    def empty(self):
        """Cancel every job of the user's and wait until the queue is empty (a cancelled job leaves it once its
        processes have ended)."""
        self.command("scancel", f"--user={self.user}", check=False, timeout=30)
        start = time.time()
        while self.queue():
            if time.time() - start > 120:
                raise AssertionError(f"the test SLURM cluster: its queue is not empty 120 s after scancel: "
                                     f"{self.queue()}")
            time.sleep(0.5)


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def wait_for(condition, what, log, timeout=60):
    start = time.time()
    while not condition():
        if time.time() - start > timeout:
            with open(log) as f:
                tail = f.read()[-3000:]
            raise AssertionError(f"the test SLURM cluster: {what} not within {timeout} s; {log}:\n{tail}")
        time.sleep(0.3)


@pytest.fixture(scope="session", name="slurm_daemons")
def start_slurm_cluster(tmp_path_factory):
    missing = [p for p in ("munged", "slurmctld", "slurmd", "sbatch") if shutil.which(p) is None and
               not os.path.exists(f"/usr/sbin/{p}")]
    if missing:
        pytest.fail(f"the SLURM tests need {', '.join(missing)}: apt-get install -y slurmctld slurmd slurm-client "
                    f"munge (.ci/run does)")
    d = str(tmp_path_factory.mktemp("slurm"))
    host, user = socket.gethostname().split(".")[0], os.environ.get("USER") or "root"
    with open(f"{d}/munge.key", "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(f"{d}/munge.key", 0o400)
    for sub in ("state", "spool"):
        os.makedirs(f"{d}/{sub}")
    conf = f"""ClusterName=test
SlurmctldHost={host}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser={user}
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.socket
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
JobRequeue=1
NodeName={host} CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""
    with open(f"{d}/slurm.conf", "w") as f:
        f.write(conf)
    env = {"SLURM_CONF": f"{d}/slurm.conf", "PATH": f"/usr/sbin:{os.environ['PATH']}"}
    full_env = {**os.environ, **env}
    procs = []
    try:
        munged = shutil.which("munged") or "/usr/sbin/munged"
        procs.append(subprocess.Popen([munged, "--foreground", "--force", f"--key-file={d}/munge.key",
                                       f"--socket={d}/munge.socket", f"--pid-file={d}/munged.pid",
                                       f"--seed-file={d}/munge.seed", f"--log-file={d}/munged.log"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        wait_for(lambda: os.path.exists(f"{d}/munge.socket"), "munged's socket", f"{d}/munged.log")
        for daemon in ("slurmctld", "slurmd"):
            procs.append(subprocess.Popen([shutil.which(daemon, path=env["PATH"]), "-D"], env=full_env,
                                          stdout=open(f"{d}/{daemon}.out", "w"), stderr=subprocess.STDOUT))

        def idle():
            proc = subprocess.run(["sinfo", "--noheader", "--format=%t"], env=full_env, capture_output=True,
                                  text=True, timeout=30)
            return proc.returncode == 0 and proc.stdout.strip() == "idle"

        wait_for(idle, "the node idle", f"{d}/slurmctld.log")
        yield Cluster(env, d, user)
    finally:
        subprocess.run(["scancel", f"--user={user}"], env=full_env, capture_output=True, timeout=30, check=False)
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(name="slurm_cluster")
def slurm_cluster_for_one_test(slurm_daemons):
    """The session's cluster (slurm_daemons), its queue emptied when the test ends."""
    try:
        yield slurm_daemons
    finally:
        slurm_daemons.empty()
