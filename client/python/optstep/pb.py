"""The optstep v1 protobuf messages and enums in one namespace, for building requests::

    from optstep import pb
    spec = pb.SessionSpec(name="job", num_trainers=1,
                          gradient_mode=pb.GRADIENT_MODE_REPLICATED,
                          parameters=[pb.ParameterSpec(name="w", shape=[4, 8])])
"""

from optstep.v1.checkpoint_service_pb2 import (CheckpointProgress, ExportStateDictRequest,
                                               ImportStateDictResponse, LoadRequest,
                                               SaveRequest, StateDictChunk)
from optstep.v1.optimizer_config_pb2 import (WEIGHT_DECAY_MODE_DECOUPLED,
                                             WEIGHT_DECAY_MODE_INDEPENDENT, WEIGHT_DECAY_MODE_L2,
                                             WEIGHT_DECAY_MODE_PALM,
                                             WEIGHT_DECAY_MODE_UNSPECIFIED, AdamWOptions,
                                             AdaptiveMuonOptions, GroupOverrides, LionOptions,
                                             MuonOptions, OptimizerConfig, RoutingRule,
                                             SgdOptions, SoapOptions, SubOptimizer)
from optstep.v1.optimizer_service_pb2 import (GroupHyperparameters, StepCommit, StepHeader,
                                              StepRequest, StepResponse, StepResult)
from optstep.v1.session_pb2 import (GRADIENT_MODE_REPLICATED, GRADIENT_MODE_SHARDED,
                                    GRADIENT_MODE_UNSPECIFIED, PARAMETER_STORAGE_OWNERS,
                                    PARAMETER_STORAGE_REPLICATED, PARAMETER_STORAGE_UNSPECIFIED,
                                    GroupInfo, Layout, ParameterSpec, QkvSplit, SessionInfo,
                                    SessionSpec, SessionSummary)
from optstep.v1.tensor_pb2 import (DTYPE_BF16, DTYPE_FP16, DTYPE_FP32, DTYPE_INT64,
                                   DTYPE_UNSPECIFIED, TensorChunk)

__all__ = [
    "CheckpointProgress", "ExportStateDictRequest", "ImportStateDictResponse", "LoadRequest",
    "SaveRequest", "StateDictChunk",
    "WEIGHT_DECAY_MODE_DECOUPLED", "WEIGHT_DECAY_MODE_INDEPENDENT", "WEIGHT_DECAY_MODE_L2",
    "WEIGHT_DECAY_MODE_PALM", "WEIGHT_DECAY_MODE_UNSPECIFIED", "AdamWOptions",
    "AdaptiveMuonOptions", "GroupOverrides", "LionOptions", "MuonOptions", "OptimizerConfig",
    "RoutingRule", "SgdOptions", "SoapOptions", "SubOptimizer",
    "GroupHyperparameters", "StepCommit", "StepHeader", "StepRequest", "StepResponse",
    "StepResult",
    "GRADIENT_MODE_REPLICATED", "GRADIENT_MODE_SHARDED", "GRADIENT_MODE_UNSPECIFIED",
    "PARAMETER_STORAGE_OWNERS", "PARAMETER_STORAGE_REPLICATED", "PARAMETER_STORAGE_UNSPECIFIED",
    "GroupInfo", "Layout", "ParameterSpec", "QkvSplit", "SessionInfo", "SessionSpec",
    "SessionSummary",
    "DTYPE_BF16", "DTYPE_FP16", "DTYPE_FP32", "DTYPE_INT64", "DTYPE_UNSPECIFIED", "TensorChunk",
]
