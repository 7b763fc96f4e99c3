"""The CPU image, built and run with podman: Dockerfile.cpu's runtime stage around the binaries
this test run built (`build_images.sh prebuilt-cpu`, no Bazel inside the image), run as a rank and
as a 2-rank group on a podman network, the way docs/deploy.md and the StatefulSet run it.
Skipped, with the reason, where podman cannot run containers (bazel/deploy_env.sh installs it)."""

import json
import os
import subprocess
import time
import uuid

import pytest

import containers
from containers import ROOT, ULIMITS

SERVER = os.path.join(ROOT, "bazel-bin", "server", "optstep_server")
CLI = os.path.join(ROOT, "bazel-bin", "client", "cli", "optstep")
CLIENT_PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
STEPS_SCRIPT = os.path.join(os.path.dirname(__file__), "image_steps.py")
PORT = 50051
GRACE_S = 10  # podman stop's default, Kubernetes' is 30
SIZE_LIMIT_MB = 300  # slim base (~75 MB) + runtime libraries + the two binaries
IMAGE_SIZES = {}  # tag -> bytes, printed at the end of the run (conftest.py)


@pytest.fixture(scope="module")
def image():
    for path in (SERVER, CLI):
        if not os.access(path, os.X_OK):
            pytest.skip(f"{os.path.relpath(path, ROOT)} is not built")
    reason = containers.unavailable()
    if reason:
        pytest.skip(reason)
    tag = f"localhost/optstep-test:{uuid.uuid4().hex[:8]}-cpu"
    build = subprocess.run([os.path.join(ROOT, "deploy", "docker", "build_images.sh"),
                            "prebuilt-cpu", tag, SERVER, CLI],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    yield tag
    containers.run("rmi", "-f", tag, check=False)


@pytest.fixture(scope="module")
def network(image):
    """A podman bridge network with a fixed subnet: the host reaches each container at its
    address, as a trainer reaches a pod."""
    name = f"optstep-test-{uuid.uuid4().hex[:8]}"
    subnet = None
    for third in range(180, 250):  # a free /24 (another run may hold one)
        proc = containers.run("network", "create", f"--subnet=10.89.{third}.0/24", name,
                              check=False)
        if proc.returncode == 0:
            subnet = f"10.89.{third}"
            break
        assert "subnet" in proc.stderr.lower() or "in use" in proc.stderr.lower(), proc.stderr
    assert subnet, "no free 10.89.x.0/24 subnet for the test network"
    yield name, subnet
    containers.run("network", "rm", "-f", name, check=False)


class Rank:
    """One container of the image, named and hostnamed optstep-<N> like a StatefulSet pod."""

    def __init__(self, image, network, ordinal, host_octet, flags=()):
        name, subnet = network
        self.ip = f"{subnet}.{host_octet}"
        self.pod = f"optstep-{ordinal}"
        self.container = f"{name}-{self.pod}-{host_octet}"
        # POD_NAME is the container's hostname, as the StatefulSet's downward API gives it.
        # The image's HEALTHCHECK without podman's timer (it needs systemd): run it by hand.
        containers.run("run", "-d", *ULIMITS, "--health-interval=disable",
                       f"--name={self.container}", f"--network={name}",
                       f"--ip={self.ip}", f"--hostname={self.pod}", f"--env=POD_NAME={self.pod}",
                       image, "--host=0.0.0.0", f"--port={PORT}", "--device=cpu",
                       f"--advertise_host={self.ip}", *flags)

    @property
    def target(self):
        return f"{self.ip}:{PORT}"

    def exec(self, *args, check=True):
        return containers.run("exec", self.container, *args, check=check)

    def health(self):
        """The image's own CLI inside the container, as its HEALTHCHECK runs it."""
        return self.exec("optstep", f"--server=127.0.0.1:{PORT}", "--timeout_ms=3000", "health",
                         check=False)

    def await_serving(self, seconds=60):
        deadline = time.time() + seconds
        while time.time() < deadline:
            proc = self.health()
            if proc.returncode == 0 and "SERVING" in proc.stdout:
                return proc.stdout.strip()
            if not self.running():
                raise AssertionError(f"{self.pod} exited before SERVING:\n{self.logs()}")
            time.sleep(0.5)
        raise AssertionError(f"{self.pod} not SERVING after {seconds} s: {proc.stdout}"
                             f"{proc.stderr}\n{self.logs()}")

    def running(self):
        state = containers.run("inspect", "--format={{.State.Running}}", self.container,
                               check=False)
        return state.stdout.strip() == "true"

    def logs(self):
        proc = containers.run("logs", self.container, check=False)
        return proc.stdout + proc.stderr

    def remove(self):
        containers.run("rm", "-f", "-t", "0", self.container, check=False)


@pytest.fixture
def ranks(image, network):
    started = []

    def start(ordinal, host_octet, flags=()):
        rank = Rank(image, network, ordinal, host_octet, flags)
        started.append(rank)
        return rank

    yield start
    for rank in started:
        rank.remove()


def steps(target, count=3):
    """The host's Python client steps a small Muon-chain model; its layout and digest."""
    if not os.access(CLIENT_PYTHON, os.X_OK):
        pytest.skip(".venv (bazel/python_env.sh) with the Python client is not built")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"))
    proc = subprocess.run([CLIENT_PYTHON, STEPS_SCRIPT, target, str(count)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_rank_serves_steps_and_stops_on_sigterm(image, ranks):
    rank = ranks(0, 10)
    assert rank.await_serving() == "SERVING"
    healthcheck = containers.run("healthcheck", "run", rank.container, check=False)
    assert healthcheck.returncode == 0, healthcheck.stdout + healthcheck.stderr  # the image's own
    one = steps(rank.target, count=1)
    assert one["step"] == 1 and one["world_size"] == 1
    # SIGTERM (what `podman stop` and the kubelet send first): a clean exit, within the grace.
    start = time.time()
    containers.run("kill", "--signal=TERM", rank.container)
    code = containers.run("wait", rank.container, timeout=GRACE_S + 30).stdout.strip()
    took = time.time() - start
    assert code == "0", f"exit {code}\n{rank.logs()}"
    assert took < GRACE_S, f"stopped after {took:.1f} s"


def test_image_contents(image, ranks):
    rank = ranks(0, 11)
    rank.await_serving()
    assert rank.exec("id", "-u").stdout.strip() == "10001"
    assert rank.exec("id", "-g").stdout.strip() == "10001"
    # No compiler, Bazel, headers or apt lists.
    found = rank.exec("sh", "-c", "for t in cc gcc g++ c++ clang ld as make bazel nvcc; do "
                      "command -v $t; done; find /usr/include /var/lib/apt/lists -type f "
                      "2>/dev/null | head -3; true").stdout.split()
    assert found == [], found
    # Every library the binaries link is in the image.
    for binary in ("/usr/local/bin/optstep_server", "/usr/local/bin/optstep"):
        ldd = rank.exec("ldd", binary).stdout
        assert "not found" not in ldd, ldd
    size = int(containers.run("image", "inspect", "--format={{.Size}}", image).stdout)
    IMAGE_SIZES[image] = size
    assert size < SIZE_LIMIT_MB * 1e6, f"{image}: {size / 1e6:.0f} MB"


def test_two_containers_step_like_one_rank(image, ranks):
    """Ranks 0 and 1 from their hostnames' ordinals (no --rank), rank 1 finding rank 0 by its
    address on the network: the parameters after the steps are bit-identical to one rank's."""
    single = ranks(0, 20)
    rank0 = ranks(0, 21, flags=["--world_size=2"])
    rank1 = ranks(1, 22, flags=["--world_size=2", f"--rendezvous={rank0.target}"])
    single.await_serving()
    rank0.await_serving()  # once both have joined
    rank1.await_serving()
    alone, group = steps(single.target), steps(rank0.target)
    assert alone["world_size"] == 1 and group["world_size"] == 2
    assert set(group["owners"]) == {0, 1}, group  # each rank owns and steps a part
    assert (group["step"], group["sha256"]) == (alone["step"], alone["sha256"])
