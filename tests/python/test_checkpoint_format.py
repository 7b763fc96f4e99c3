"""Checkpoint directories are readable without optstep: the shards with the `safetensors` package,
the manifest with `json` (docs/checkpoints.md).

A small C++ tool (//tests/checkpoint:write_sample_checkpoint) writes a two-rank
checkpoint with the real writer and prints what it wrote; `optstep ckpt split` reshards it.
Both binaries are built with bazel when needed.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import subprocess
from typing import Dict, List

import numpy as np
import pytest

import safetensors.numpy as safetensors_numpy
from safetensors import safe_open

from repository import REPOSITORY_ROOT

WRITER = "tests/checkpoint/write_sample_checkpoint"
CLI = "client/cli/optstep"


@pytest.fixture(scope="module")
def binaries() -> Dict[str, pathlib.Path]:
    root = REPOSITORY_ROOT
    subprocess.run(["bazel", "build", "//" + WRITER.replace("/write", ":write"),
                    "//client/cli:optstep"], cwd=root, check=True, capture_output=True)
    paths = {"writer": root / "bazel-bin" / WRITER, "cli": root / "bazel-bin" / CLI}
    for path in paths.values():
        assert path.is_file(), f"no binary at {path}"
    return paths


def _crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli, reflected 0x82F63B78), bytewise: independent of the C++ code."""
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    crc = 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _expected(description: dict) -> Dict[str, np.ndarray]:
    dtypes = {"F32": np.float32, "I64": np.int64}
    return {key: np.array(t["values"], dtype=dtypes[t["dtype"]]).reshape(t["shape"])
            for key, t in description.items()}


def _check_manifest(directory: pathlib.Path, world: int) -> dict:
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["format_version"] == 1
    assert manifest["world_size"] == world
    assert (manifest["step"], manifest["skipped_steps"]) == (7, 1)
    assert [p["name"] for p in manifest["params"]] == ["w0", "b0", "w1", "emb"]
    assert manifest["params"][2]["shape"] == [2, 5]
    canonical = json.dumps(manifest["definition"], sort_keys=True, separators=(",", ":"))
    assert manifest["definition_digest"] == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    assert [s["file"] for s in manifest["shards"]] == [
        f"shard-{r}-of-{world}.safetensors" for r in range(world)]
    for shard in manifest["shards"]:
        data = (directory / shard["file"]).read_bytes()
        assert len(data) == shard["bytes"]
        assert f"{_crc32c(data):08x}" == shard["crc32c"]
    return manifest


def _owner_of(key: str, manifest: dict) -> int:
    """The rank that must hold `key`, or -1 for tensors every rank holds."""
    owners = {p["name"]: p["owner"] for p in manifest["params"]}
    parts = key.split("/")
    if parts[0] == "param":
        return owners.get("/".join(parts[1:]), -1)
    if parts[0] == "state" and len(parts) >= 4:
        return owners.get("/".join(parts[2:-1]), -1)
    return -1


def _check_shards(directory: pathlib.Path, manifest: dict, expected: Dict[str, np.ndarray]) -> None:
    seen: Dict[str, List[int]] = {}
    for rank, shard in enumerate(manifest["shards"]):
        tensors = safetensors_numpy.load_file(str(directory / shard["file"]))
        for key, value in tensors.items():
            want = expected[key]
            assert value.dtype == want.dtype, key
            assert value.shape == want.shape, key
            np.testing.assert_array_equal(value, want, err_msg=key)
            seen.setdefault(key, []).append(rank)
    assert set(seen) == set(expected)
    for key, ranks in seen.items():
        owner = _owner_of(key, manifest)
        assert ranks == (list(range(manifest["world_size"])) if owner < 0 else [owner]), key


def test_written_checkpoint_reads_with_safetensors(binaries, tmp_path: pathlib.Path) -> None:
    run = subprocess.run([str(binaries["writer"]), str(tmp_path), "sample"], check=True,
                         capture_output=True, text=True)
    expected = _expected(json.loads(run.stdout))
    directory = tmp_path / "sample"
    assert sorted(p.name for p in directory.iterdir()) == [
        "manifest.json", "shard-0-of-2.safetensors", "shard-1-of-2.safetensors"]
    manifest = _check_manifest(directory, 2)
    _check_shards(directory, manifest, expected)

    # Non-parameter-shaped state and 0-d int64 counters, through the lazy reader too.
    with safe_open(str(directory / "shard-1-of-2.safetensors"), framework="np") as f:
        assert f.get_tensor("state/soap/w1/R").shape == (5, 5)
        step = f.get_tensor("state/soap/w1/step")
        assert step.dtype == np.int64 and step.shape == () and int(step) == 7
    assert expected["param/w0"][0, 1] == np.float32(1.25)


def test_split_checkpoint_reads_with_safetensors(binaries, tmp_path: pathlib.Path) -> None:
    run = subprocess.run([str(binaries["writer"]), str(tmp_path), "sample"], check=True,
                         capture_output=True, text=True)
    expected = _expected(json.loads(run.stdout))
    subprocess.run([str(binaries["cli"]), "ckpt", "split", str(tmp_path / "sample"),
                    str(tmp_path / "split3"), "--ranks=3"], check=True, capture_output=True)
    manifest = _check_manifest(tmp_path / "split3", 3)
    assert sorted({p["owner"] for p in manifest["params"]}) == [0, 1, 2]
    _check_shards(tmp_path / "split3", manifest, expected)
    verify = subprocess.run([str(binaries["cli"]), "ckpt", "verify", str(tmp_path / "split3")],
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
