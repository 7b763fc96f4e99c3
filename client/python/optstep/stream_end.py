"""The final message of a client stream of tensor chunks (InitParameters, ImportStateDict).

The server applies such a stream only when it ends with a ``StreamEnd`` that agrees with what came
before it: the number of chunk messages, their payload bytes, the CRC-32 (zlib's) of the payloads
in order, and the number of distinct tensors. :class:`StreamTally` counts what a stream sends.
"""

from __future__ import annotations

import zlib

from optstep.v1 import tensor_pb2

__all__ = ["StreamTally"]


class StreamTally:
    """Counts the chunk messages and payload bytes a stream sends, and their CRC-32."""

    def __init__(self) -> None:
        self.chunks = 0
        self.bytes = 0
        self.crc32 = 0

    def add(self, data: bytes) -> bytes:
        """Counts one chunk message's payload; answers it unchanged."""
        self.chunks += 1
        self.bytes += len(data)
        self.crc32 = zlib.crc32(data, self.crc32)
        return data

    def end(self, tensors: int) -> tensor_pb2.StreamEnd:
        """The final message: this tally, with `tensors` distinct tensors."""
        return tensor_pb2.StreamEnd(chunks=self.chunks, bytes=self.bytes, crc32=self.crc32,
                                    tensors=tensors)
