"""Build hook of the optstep package: generates optstep/v1/*_pb2*.py from the .proto files.

The stubs are generated with grpcio-tools into the source tree (so editable installs see them)
before the regular build_py step copies the package. The .proto files come from
$OPTSTEP_PROTO_ROOT, else from ../../proto (the repository layout). Only the trainer-facing
protos are compiled; internal.proto (rank to rank) is not part of the client.

The runtime requirements are pinned to the generator: the generated code checks that the
protobuf and grpcio it runs with are at least the versions that generated it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import os
import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PUBLIC_PROTOS = ("tensor", "session", "optimizer_config", "optimizer_service", "checkpoint_service")


def _proto_root() -> pathlib.Path:
    override = os.environ.get("OPTSTEP_PROTO_ROOT")
    return pathlib.Path(override) if override else HERE.parent.parent / "proto"


def generate_stubs() -> None:
    """Runs protoc (from grpcio-tools) over the public protos into optstep/v1/."""
    from grpc_tools import protoc  # build requirement

    root = _proto_root()
    files = [f"optstep/v1/{name}.proto" for name in PUBLIC_PROTOS]
    missing = [f for f in files if not (root / f).is_file()]
    if missing:
        raise RuntimeError(f"optstep: protos not found under {root}: {missing} "
                           "(set OPTSTEP_PROTO_ROOT to the repository's proto/ folder)")
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    args = ["protoc", f"-I{root}", f"-I{well_known}", f"--python_out={HERE}",
            f"--pyi_out={HERE}", f"--grpc_python_out={HERE}", *files]
    if protoc.main(args) != 0:
        raise RuntimeError(f"optstep: protoc failed on {files}")


def _runtime_requirements() -> list[str]:
    protobuf = importlib.metadata.version("protobuf")
    grpc_tools = importlib.metadata.version("grpcio-tools")
    major = int(protobuf.split(".")[0])
    return [f"grpcio>={grpc_tools}", f"protobuf>={protobuf},<{major + 1}", "numpy>=1.23"]


class BuildPyWithStubs(build_py):
    """build_py that generates the stubs first."""

    def run(self) -> None:
        generate_stubs()
        super().run()


setup(install_requires=_runtime_requirements(), cmdclass={"build_py": BuildPyWithStubs})
