"""Element types on the wire and the conversion of arrays to and from their wire bytes.

Tensors cross gRPC as raw little-endian bytes of fp32, bf16 or fp16 (``optstep.v1.DType``).
numpy has no bfloat16, so bf16 values are carried as ``np.uint16`` arrays of raw bits; the
helpers :func:`bf16_bits_from_fp32` (round to nearest even, as the server does) and
:func:`fp32_from_bf16_bits` convert. torch tensors (float32, bfloat16, float16) are accepted
wherever an array is, without this module importing torch.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np

from optstep.errors import InvalidArgumentError
from optstep.v1 import tensor_pb2

__all__ = [
    "DTypeLike",
    "WireDType",
    "FP32",
    "BF16",
    "FP16",
    "INT64",
    "wire_dtype",
    "return_dtype",
    "dtype_name",
    "element_size",
    "numpy_dtype",
    "bf16_bits_from_fp32",
    "fp32_from_bf16_bits",
    "to_wire_array",
    "state_dict_dtype",
]

#: A value of the ``optstep.v1.DType`` enum (an int).
WireDType = tensor_pb2.DType

FP32: WireDType = tensor_pb2.DTYPE_FP32
BF16: WireDType = tensor_pb2.DTYPE_BF16
FP16: WireDType = tensor_pb2.DTYPE_FP16
#: State dicts only: the servers' step counters (0-d int64 tensors).
INT64: WireDType = tensor_pb2.DTYPE_INT64

#: A wire element type: "fp32" / "float32", "bf16" / "bfloat16", "fp16" / "float16", "int64"
#: (state dicts only), or a ``optstep.v1.DType`` value (FP32, BF16, FP16, INT64).
DTypeLike = Union[str, int]

_NAMES = {
    "fp32": FP32, "float32": FP32, "f32": FP32,
    "bf16": BF16, "bfloat16": BF16,
    "fp16": FP16, "float16": FP16, "f16": FP16, "half": FP16,
    "int64": INT64,
}
_CANONICAL: Dict[int, str] = {FP32: "fp32", BF16: "bf16", FP16: "fp16", INT64: "int64"}
_BY_VALUE: Dict[int, WireDType] = {FP32: FP32, BF16: BF16, FP16: FP16, INT64: INT64}
_NUMPY: Dict[int, np.dtype] = {FP32: np.dtype("<f4"), BF16: np.dtype("<u2"),
                               FP16: np.dtype("<f2"), INT64: np.dtype("<i8")}


def wire_dtype(dtype: DTypeLike) -> WireDType:
    """The ``optstep.v1.DType`` value of `dtype`; InvalidArgumentError for anything else."""
    if isinstance(dtype, str):
        wire = _NAMES.get(dtype.lower())
        if wire is not None:
            return wire
    elif isinstance(dtype, int) and dtype in _BY_VALUE:
        return _BY_VALUE[dtype]
    raise InvalidArgumentError(f"dtype {dtype!r} is not one of fp32, bf16, fp16")


def return_dtype(dtype: DTypeLike) -> WireDType:
    """The wire type of returned parameters: fp32 or bf16; InvalidArgumentError otherwise."""
    wire = wire_dtype(dtype)
    if wire not in (FP32, BF16):
        raise InvalidArgumentError(f"parameters can be returned as fp32 or bf16, not "
                                   f"{dtype_name(wire)}")
    return wire


def dtype_name(dtype: DTypeLike) -> str:
    """"fp32", "bf16" or "fp16"."""
    return _CANONICAL[wire_dtype(dtype)]


def element_size(dtype: DTypeLike) -> int:
    """Bytes per element on the wire (4 or 2)."""
    return _NUMPY[wire_dtype(dtype)].itemsize


def numpy_dtype(dtype: DTypeLike) -> np.dtype:
    """The numpy dtype that holds `dtype`'s elements (uint16 raw bits for bf16)."""
    return _NUMPY[wire_dtype(dtype)]


def bf16_bits_from_fp32(values: np.ndarray) -> np.ndarray:
    """Rounds fp32 values to bfloat16 (nearest, ties to even) and answers the raw uint16 bits.

    NaN stays a (quiet) NaN; values that round past the largest bf16 become infinite, as in the
    server's conversion.
    """
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    out = (rounded >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        out[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return out


def fp32_from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """The fp32 values of raw bfloat16 bits (exact)."""
    wide = np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)
    return wide.view(np.float32)


def state_dict_dtype(value: Any) -> Optional[str]:
    """The wire type a state-dict tensor goes as when not its own: "bf16" for uint16 bits,
    "int64" for integer counters (numpy arrays or torch tensors), else None."""
    if _is_torch_tensor(value):
        return None if value.is_floating_point() else "int64"
    kind = np.asarray(value).dtype
    if kind == np.uint16:
        return "bf16"
    return "int64" if np.issubdtype(kind, np.integer) else None


def _is_torch_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _from_torch(tensor: Any) -> Tuple[np.ndarray, Optional[WireDType]]:
    """A numpy view (or copy, off the CPU) of a torch tensor and its natural wire dtype."""
    import torch

    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), BF16
    if t.dtype in (torch.float32, torch.float16, torch.float64) or not (
            t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
        return t.numpy(), None  # integers: only as state-dict counters, see to_wire_array
    raise InvalidArgumentError(f"tensor of dtype {t.dtype} is not float32, bfloat16 or float16")


def to_wire_array(values: Any, dtype: Optional[DTypeLike] = None,
                  what: str = "tensor") -> Tuple[np.ndarray, WireDType]:
    """Flattens `values` into a contiguous little-endian array of a wire dtype.

    `values` is a numpy array (float32, float16, float64, or uint16 bf16 bits with
    ``dtype="bf16"``), a torch tensor (float32, bfloat16, float16, float64) or anything
    ``np.asarray`` accepts. Without `dtype` the values keep their own type (float64 becomes
    fp32); with `dtype` they are converted (fp32 to bf16 rounds to nearest even). Answers the
    1-D array and its ``optstep.v1.DType``. InvalidArgumentError, naming `what`, for other types.
    """
    wanted = None if dtype is None else wire_dtype(dtype)
    natural: Optional[WireDType]
    if _is_torch_tensor(values):
        array, natural = _from_torch(values)
    else:
        array, natural = np.asarray(values), None
    if natural is None:
        kind = array.dtype
        if kind == np.float32 or kind == np.float64:
            natural = FP32
        elif kind == np.float16:
            natural = FP16
        elif kind == np.uint16 and wanted == BF16:
            natural = BF16
        elif np.issubdtype(kind, np.integer) and wanted == INT64:
            natural = INT64  # counters of state dicts
        else:
            hint = " (pass dtype='bf16' for raw bfloat16 bits)" if kind == np.uint16 else ""
            raise InvalidArgumentError(
                f"{what}: element type {kind} is not float32, float16 or bfloat16{hint}")
        array = array.astype(_NUMPY[natural], copy=False)
    target = natural if wanted is None else wanted
    if (target == INT64) != (natural == INT64):
        raise InvalidArgumentError(f"{what}: {array.dtype} values cannot go as "
                                   f"{dtype_name(target)}")
    if target != natural:
        as_fp32 = fp32_from_bf16_bits(array) if natural == BF16 else array.astype(np.float32)
        if target == BF16:
            array = bf16_bits_from_fp32(as_fp32)
        else:
            array = as_fp32.astype(_NUMPY[target], copy=False)
    return np.ascontiguousarray(array).reshape(-1), target
