"""optstep: the Python client of the optstep optimizer-step service.

- :class:`Client` — sessions, steps (numpy arrays or torch tensors; fp32, bf16, fp16), parameters,
  layouts, state dicts, checkpoints and health; routes chunks to the owner ranks.
- :mod:`optstep.config` — builders for optimizer chains and presets.
- :mod:`optstep.pb` — the v1 protobuf messages (SessionSpec, ParameterSpec, ...).
- :mod:`optstep.torch` — :class:`optstep.torch.RemoteOptimizer`, a ``torch.optim.Optimizer``
  whose steps run on the service (imports torch; not loaded by ``import optstep``).
- Errors are :class:`OptstepError` subclasses carrying the gRPC code and message;
  :class:`RewindRequired` says the group restored a session to an older step.

``optstep.__version__`` is the package's version. See docs/python.md.
"""

from optstep import config, pb
from optstep._version import __version__ as __version__
from optstep.chunks import GradientSlice
from optstep.client import (MAX_CHUNK_BYTES, Client, CreatedSession, GroupSchedule, Parameters,
                            StepReply)
from optstep.dtypes import bf16_bits_from_fp32, fp32_from_bf16_bits
from optstep.errors import *  # noqa: F401,F403  (the exception classes)
from optstep.errors import __all__ as _error_names  # noqa: F401
from optstep.layout import ParamLayout, SessionLayout
from optstep.local import LocalGroup, LocalServer
from optstep.recovery import RewindRequired

__all__ = [
    "Client", "CreatedSession", "GroupSchedule", "StepReply", "Parameters", "GradientSlice",
    "SessionLayout", "ParamLayout", "LocalServer", "LocalGroup", "MAX_CHUNK_BYTES", "config", "pb",
    "bf16_bits_from_fp32", "fp32_from_bf16_bits", "RewindRequired", *_error_names,
]
