"""optstep.torch: PyTorch adapter of the optstep client (imports torch).

- :class:`RemoteOptimizer` — a ``torch.optim.Optimizer`` whose steps run on an optstep session.
- :func:`describe_parameters` — a module's named parameters as the session's ParameterSpecs
  (embedding/output detection, QKV splits, overrides).
"""

from optstep.torch.model_spec import ParamDescription, describe_parameters
from optstep.torch.remote_optimizer import RemoteOptimizer

__all__ = ["RemoteOptimizer", "describe_parameters", "ParamDescription"]
