"""The container engine of tests/deploy/test_images.py: podman as deploy/docker/build_images.sh
runs it (runc, cgroupfs, explicit ulimits), and why it cannot run here when it cannot."""

import os
import shutil
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
SLIM = "docker.io/library/debian:bookworm-slim"


def engine():
    """podman's command line (runc and cgroupfs, as build_images.sh uses it)."""
    runc = shutil.which("runc")
    return ["podman"] + (["--runtime", runc] if runc else []) + ["--cgroup-manager=cgroupfs"]


def run(*args, check=True, timeout=120):
    proc = subprocess.run(engine() + list(args), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {proc.returncode}: {proc.stderr}")
    return proc


def unavailable():
    """Why no container can run here (None: they can). Makes the slim base image first (from
    Debian's mirror, a minute or two, once), which the check and the image build need."""
    if shutil.which("podman") is None:
        return "podman is not installed (bazel/deploy_env.sh installs it as root)"
    if os.geteuid() != 0:
        return "the image tests run podman as root"
    base = subprocess.run([os.path.join(ROOT, "deploy", "docker", "build_images.sh"), "base-slim"],
                          capture_output=True, text=True, timeout=600)
    if base.returncode != 0:
        return f"no base image (build_images.sh base-slim): {base.stderr.strip()[-300:]}"
    probe = run("run", "--rm", *ULIMITS, "--network=none", SLIM, "true", check=False)
    if probe.returncode != 0:
        return f"podman cannot run a container here: {probe.stderr.strip()[-300:]}"
    return None
