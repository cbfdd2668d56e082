"""One `mpirun` per test file, under a time limit, surviving what it does.

The job runs in a session of its own. Past its limit it gets SIGTERM (mpirun
then ends its ranks and any spawned children), and SIGKILL 15 s later; any
rank still alive after that (a rank process that left mpirun's process
group) is killed by the pid its record gave. The ranks' records and logs
stay in the file's folder; the job's own output (mpirun's messages: which
rank died of which signal) goes to mpirun.log there.
"""
import os
import re
import signal
import subprocess
import time

from . import outcomes

RANK_MAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_main.py")


class Job:
    """How every file's job is started: the same for all files of a phase."""

    def __init__(self, python, np, testdir, env, exported, rank_args, timeout):
        self.python = python
        self.np = np
        self.testdir = testdir
        self.env = env
        self.exported = exported
        self.rank_args = rank_args
        self.timeout = timeout

    def command(self, test_file, record_dir):
        cmd = ["mpirun", "-n", str(self.np), "--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        for name in self.exported:
            cmd += ["-x", name]
        cmd += [self.python, "-B", RANK_MAIN, "--testdir", self.testdir, "--record", record_dir]
        cmd += self.rank_args + ["--", test_file]
        return cmd


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_our_rank(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return RANK_MAIN.encode() in f.read()
    except OSError:
        return False


def stop(proc):
    """End a job past its limit: SIGTERM, then SIGKILL, to its session."""
    for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def job_note(log_path, rc, timed_out, limit):
    if timed_out:
        return f"killed after {limit} s"
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    m = re.search(r"rank (\d+) with PID \d+ on node \S+ exited on signal (\d+) \(([^)]*)\)", text)
    if m:
        return f"rank {m.group(1)}: signal {m.group(2)}, {m.group(3)}"
    m = re.search(r"MPI_ABORT was invoked on rank (\d+)", text)
    if m:
        return f"MPI_Abort on rank {m.group(1)}"
    return f"exit status {rc}" if rc else ""


def run_file(job, test_file, phase_dir):
    record_dir = os.path.join(phase_dir, test_file)
    os.makedirs(record_dir, exist_ok=True)
    for old in os.listdir(record_dir):
        os.unlink(os.path.join(record_dir, old))
    log_path = os.path.join(record_dir, "mpirun.log")
    t0 = time.monotonic()
    timed_out = False
    with open(log_path, "w") as log:
        proc = subprocess.Popen(job.command(test_file, record_dir), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=job.env, cwd=job.testdir,
                                start_new_session=True)
        try:
            rc = proc.wait(job.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            stop(proc)
            rc = proc.returncode if proc.returncode is not None else -9
    seconds = time.monotonic() - t0
    ranks = outcomes.read_ranks(record_dir, job.np)
    for r in ranks:
        if r.pid and alive(r.pid) and is_our_rank(r.pid):
            os.kill(r.pid, signal.SIGKILL)
    note = job_note(log_path, rc, timed_out, job.timeout)
    return outcomes.classify(test_file, ranks, rc, timed_out, seconds, note)
