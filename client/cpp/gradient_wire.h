#ifndef OPTSTEP_CLIENT_CPP_GRADIENT_WIRE_H_
#define OPTSTEP_CLIENT_CPP_GRADIENT_WIRE_H_

// A gradient chunk as the wire bytes of StepRequest{gradient: TensorChunk}, built without
// copying the tensor: a small slice with every byte up to `data`'s payload, then a slice that
// refers to the caller's memory (docs/design.md §4). The bytes are exactly protobuf's serialisation
// of the same message, so the server and other clients see an ordinary StepRequest.
// Internal to client/.

#include <grpcpp/support/byte_buffer.h>

#include <string>

#include "client/cpp/client_types.h"

namespace optstep {
namespace client_internal {

// The bytes of StepRequest{gradient} that precede the payload of `chunk.bytes`.
std::string GradientChunkHeader(const GradientSlice& chunk);

// The whole message as [header, payload] slices. The payload slice refers to `chunk.bytes`:
// REQUIRES that memory to stay valid until gRPC releases the slice, which it reports by
// calling `release(arg)` once (possibly on one of its threads).
grpc::ByteBuffer GradientChunkMessage(const GradientSlice& chunk, void (*release)(void*),
                                      void* arg);

}  // namespace client_internal
}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CPP_GRADIENT_WIRE_H_
