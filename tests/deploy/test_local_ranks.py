"""deploy/local/ranks.sh: the syntax and the arguments (`start N [DIR] [-- flags]`, `stop [DIR]`)
of docs/deploy.md. No server is built or started: OPTSTEP_SERVER points at a stand-in that
records its environment and arguments, prints the `listening on` line and sleeps."""

import os
import signal
import subprocess
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RANKS = os.path.join(ROOT, "deploy", "local", "ranks.sh")
STAND_IN = """#!/usr/bin/env bash
echo "$POD_NAME $*" >>"$STAND_IN_LOG"
echo "listening on 127.0.0.1:$((50100 + ${POD_NAME##*-}))"
exec sleep 60
"""


def test_syntax():
    subprocess.run(["bash", "-n", RANKS], check=True)


@pytest.fixture
def ranks(tmp_path):
    server = tmp_path / "optstep_server"
    server.write_text(STAND_IN)
    server.chmod(0o755)
    (tmp_path / "tmp").mkdir()
    (tmp_path / "cwd").mkdir()
    env = dict(os.environ, OPTSTEP_SERVER=str(server), TMPDIR=str(tmp_path / "tmp"),
               STAND_IN_LOG=str(tmp_path / "args"))
    started = []

    def run(*args, check=True):
        proc = subprocess.run(["bash", RANKS, *args], cwd=tmp_path / "cwd", env=env,
                              capture_output=True, text=True, timeout=60)
        if check:
            assert proc.returncode == 0, proc.stderr
        if args and args[0] == "start" and proc.returncode == 0:
            started.append(proc.stdout.splitlines()[0])
        return proc

    def calls():  # POD_NAME -> the server's arguments
        with open(tmp_path / "args") as f:
            return {line.split()[0]: line.split()[1:] for line in f}

    run.calls, run.tmp, run.env = calls, tmp_path, env
    yield run
    for d in started:  # whatever a failed test left running
        if os.path.exists(os.path.join(d, "pids")):
            for pid in pids_of(d):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass


def pids_of(directory):
    with open(os.path.join(directory, "pids")) as f:
        return [int(p) for p in f.read().split()]


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_start_without_dir_takes_the_flags_after_the_separator(ranks):
    out = ranks("start", "2", "--", "--step_deadline_ms=5000").stdout.splitlines()
    directory = out[0]
    assert os.path.dirname(directory) == str(ranks.tmp / "tmp")  # a fresh temporary directory
    assert os.path.basename(directory).startswith("optstep-ranks.")
    assert out[1:] == ["127.0.0.1:50100", "127.0.0.1:50101"]
    with open(os.path.join(directory, "targets")) as f:
        assert f.read().split() == out[1:]
    assert not os.path.exists(ranks.tmp / "cwd" / "--")
    assert not os.path.exists(os.path.join(ROOT, "--"))
    calls = ranks.calls()
    assert calls["optstep-0"] == ["--host=127.0.0.1", "--port=0", "--world_size=2",
                                  "--step_deadline_ms=5000"]
    assert calls["optstep-1"] == ["--host=127.0.0.1", "--port=0", "--world_size=2",
                                  "--rendezvous=127.0.0.1:50100", "--step_deadline_ms=5000"]
    pids = pids_of(directory)
    assert len(pids) == 2 and all(alive(p) for p in pids)
    # `stop` without DIR stops the group of the last start.
    ranks("stop")
    assert not os.path.exists(os.path.join(directory, "pids"))
    deadline = time.time() + 10
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)


@pytest.mark.parametrize("args", [["g"], ["g", "--"], ["g", "--", "--max_sessions=3"]])
def test_start_with_dir(ranks, args):
    out = ranks("start", "1", *args).stdout.splitlines()
    directory = str(ranks.tmp / "cwd" / "g")  # relative to the caller's directory
    assert out == [directory, "127.0.0.1:50100"]
    assert ranks.calls()["optstep-0"] == ["--host=127.0.0.1", "--port=0", "--world_size=1"] + \
        args[2:]
    assert os.path.exists(os.path.join(directory, "rank-0.log"))
    ranks("stop", "g")
    assert not os.path.exists(os.path.join(directory, "pids"))


@pytest.mark.parametrize("args", [[], ["start"], ["start", "--"], ["start", "0"], ["start", "x"],
                                  ["restart", "2"]])
def test_bad_arguments_print_the_usage(ranks, args):
    proc = ranks(*args, check=False)
    assert proc.returncode == 64
    assert "ranks.sh start N [DIR]" in proc.stdout + proc.stderr
    assert not os.path.exists(ranks.tmp / "args")  # no server started


def test_stop_without_an_earlier_start(ranks):
    proc = ranks("stop", check=False)
    assert proc.returncode == 64 and "no DIR" in proc.stderr


# Exits with `status` the first `failures` times it runs as a given rank, then serves (sleeps).
FAILING_STAND_IN = """#!/usr/bin/env bash
echo "$POD_NAME $*" >>"$STAND_IN_LOG"
echo "listening on 127.0.0.1:$((50100 + ${POD_NAME##*-}))"
runs="$STAND_IN_LOG.$POD_NAME"
echo x >>"$runs"
if (( $(wc -l <"$runs") <= FAILURES )); then exit "$STATUS"; fi
exec sleep 60
"""


def start_failing(ranks, failures, status, **env):
    ranks.tmp.joinpath("optstep_server").write_text(FAILING_STAND_IN)
    ranks.env.update(FAILURES=str(failures), STATUS=str(status), OPTSTEP_RESTART_DELAY="0.1",
                     **env)
    return ranks("start", "2", "--", "--checkpoint_root=/x").stdout.splitlines()[0]


def lines_of(path, pod):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.split()[1:] for line in f if line.split()[0] == pod]


def await_lines(path, pod, count, seconds=10):
    deadline = time.time() + seconds
    while len(lines_of(path, pod)) < count and time.time() < deadline:
        time.sleep(0.05)
    return lines_of(path, pod)


def test_a_rank_that_exits_75_is_restarted_on_its_port(ranks):
    directory = start_failing(ranks, failures=1, status=75)
    for r in range(2):
        runs = await_lines(ranks.tmp / "args", f"optstep-{r}", 2)
        assert len(runs) == 2, runs
        assert runs[0][1] == "--port=0"
        assert runs[1][1] == f"--port={50100 + r}"  # the port it listened on before
        assert runs[1][:1] + runs[1][2:] == runs[0][:1] + runs[0][2:]
    with open(os.path.join(directory, "rank-1.log")) as f:
        assert "rank 1 exited with status 75; restarting it" in f.read()
    pids = pids_of(directory)
    assert all(alive(p) for p in pids)
    ranks("stop", directory)
    deadline = time.time() + 10
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)
    time.sleep(0.3)  # a stopped rank is not restarted
    assert len(lines_of(ranks.tmp / "args", "optstep-1")) == 2


def test_restarts_are_bounded(ranks):
    directory = start_failing(ranks, failures=100, status=75, OPTSTEP_MAX_RESTARTS="2")
    runs = await_lines(ranks.tmp / "args", "optstep-1", 4, seconds=3)
    assert len(runs) == 3  # the start and two restarts
    with open(os.path.join(directory, "rank-1.log")) as f:
        assert "3 restarts within a minute: giving up" in f.read()
    ranks("stop", directory)


def test_a_rank_that_exits_0_is_not_restarted(ranks):
    start_failing(ranks, failures=1, status=0)
    time.sleep(0.5)
    assert len(lines_of(ranks.tmp / "args", "optstep-1")) == 1
