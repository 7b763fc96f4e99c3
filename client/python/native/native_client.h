#ifndef OPTSTEP_CLIENT_PYTHON_NATIVE_NATIVE_CLIENT_H_
#define OPTSTEP_CLIENT_PYTHON_NATIVE_NATIVE_CLIENT_H_

// The C interface of liboptstep_native.so, the native data path of the Python client
// (client/python/optstep/native.py declares the same structs with ctypes). It wraps one
// optstep::Client (client/cpp/client.h): a step takes the gradients as (pointer, element count,
// dtype) slices of the caller's memory and writes the returned parameters into the caller's
// buffers, so a whole step is one call whatever the number of chunks.
//
// Element types are optstep.v1.DType values (1 fp32, 2 bf16, 3 fp16). Every function that can
// fail answers a gRPC status code (0: OK) and writes the message, NUL-terminated and cut to
// `error_len` bytes, into `error`.
//
// Thread-safety: as optstep::Client; calls on one handle may run from several threads at once.
// None holds the caller's GIL: ctypes releases it around each call.

#include <stddef.h>
#include <stdint.h>

#define OPTSTEP_NATIVE_API extern "C" __attribute__((visibility("default")))

// Connection settings: ClientOptions (client/cpp/client_options.h) field by field; durations in
// seconds, strings NUL-terminated (empty: unset).
struct OptstepNativeOptions {
  const char* const* rank_targets;  // by rank
  uint32_t num_ranks;
  double connect_timeout_s;
  double rpc_timeout_s;
  double stream_timeout_s;
  double recovery_timeout_s;
  int32_t wait_for_ready;
  int32_t max_message_bytes;
  int32_t stream_lookahead_bytes;
  int32_t max_frame_bytes;
  int32_t bdp_probe;
  uint64_t max_chunk_bytes;
  int32_t tls;
  const char* tls_ca_file;
  const char* tls_cert_file;
  const char* tls_key_file;
  const char* tls_server_name;
  const char* token;
};

// `count` elements of `dtype` at `data` land at element `offset` of parameter `param_id`.
struct OptstepNativeSlice {
  uint32_t param_id;
  uint32_t dtype;
  uint64_t offset;
  uint64_t count;
  const void* data;
};

// This step's schedule values of one hyperparameter group; has_* = 0 keeps the default.
struct OptstepNativeGroup {
  uint32_t group_id;
  int32_t has_lr;
  double lr;
  int32_t has_weight_decay;
  double weight_decay;
};

// Where a returned parameter goes: `count` elements of `dtype` (the step's return dtype).
struct OptstepNativeOut {
  uint32_t param_id;
  uint32_t dtype;
  uint64_t count;
  void* data;
};

struct OptstepNativeResult {
  uint64_t step;
  int32_t skipped;
  int32_t clipped;
  double grad_norm;
  uint32_t params_written;  // 0 for skip_return and for a skipped step that sent none
  int32_t rewind;           // 1: ABORTED because the session came back at `rewind_step`
  uint64_t rewind_step;
  uint64_t expected_step;  // FAILED_PRECONDITION out of sequence: the step expected (else 0)
};

// sizeof(OptstepNativeResult): the loader checks it against its own layout of the struct, so that
// a library of another release is refused rather than written past a buffer.
OPTSTEP_NATIVE_API size_t optstep_native_result_bytes(void);

// Connects (Client::Connect). Answers the handle, or null with the error in `code`/`error`.
OPTSTEP_NATIVE_API void* optstep_native_connect(const OptstepNativeOptions* options, int32_t* code,
                                                char* error, size_t error_len);
OPTSTEP_NATIVE_API void optstep_native_close(void* client);
// Client::StateReplaced: the session's state was replaced at `step` (a Load or an import the
// Python client made), for trainer `trainer_id` alone when it is not negative.
OPTSTEP_NATIVE_API void optstep_native_state_replaced(void* client, const char* session_id,
                                                      uint64_t step, int64_t trainer_id);

// One optimizer step (Client::Step). Every returned parameter is written into its `outs` entry
// as its chunks arrive, with no copy beside it; each out must have the parameter's element count
// and the return dtype (INVALID_ARGUMENT otherwise, before any gradient is sent). A step that
// fails may have written some outs; its redo (the client's recovery, or the caller's retry of
// the same step) writes them all.
// REQUIRES: the slices' and the outs' memory stays valid (and the outs unread) during the call.
OPTSTEP_NATIVE_API int32_t optstep_native_step(
    void* client, const char* session_id, uint64_t step, uint32_t trainer_id,
    const OptstepNativeGroup* groups, size_t num_groups, uint32_t return_dtype,
    const uint32_t* return_param_ids, size_t num_return_param_ids, int32_t skip_return,
    const OptstepNativeSlice* slices, size_t num_slices, const OptstepNativeOut* outs,
    size_t num_outs, OptstepNativeResult* result, char* error, size_t error_len);

// Called with a parameter's id once all of it has been written into its out.
typedef void (*OptstepNativeReadyFn)(uint32_t param_id);

// A step whose gradients are added while they are produced (Client::OpenStep, StepStream):
// open sends the header (answers the stream, or null with the error), each add queues slices
// (validated as a step's; the stream goes on after a refused add), finish commits and answers
// as optstep_native_step does, except that each out is written as its parameter's chunks
// arrive, `ready` (may be null; on the thread that calls finish) telling when one is whole, and
// a reply that fails may have written some; close ends the stream (cancelled unless finished).
// REQUIRES: the added slices' memory stays valid until finish has returned or close was called.
OPTSTEP_NATIVE_API void* optstep_native_step_open(void* client, const char* session_id,
                                                  uint64_t step, uint32_t trainer_id,
                                                  const OptstepNativeGroup* groups,
                                                  size_t num_groups, uint32_t return_dtype,
                                                  const uint32_t* return_param_ids,
                                                  size_t num_return_param_ids, int32_t skip_return,
                                                  int32_t* code, char* error, size_t error_len);
OPTSTEP_NATIVE_API int32_t optstep_native_step_add(void* stream, const OptstepNativeSlice* slices,
                                                   size_t num_slices, char* error,
                                                   size_t error_len);
OPTSTEP_NATIVE_API int32_t optstep_native_step_finish(void* stream, const OptstepNativeOut* outs,
                                                      size_t num_outs, OptstepNativeReadyFn ready,
                                                      OptstepNativeResult* result, char* error,
                                                      size_t error_len);
OPTSTEP_NATIVE_API void optstep_native_step_close(void* stream);

#endif  // OPTSTEP_CLIENT_PYTHON_NATIVE_NATIVE_CLIENT_H_
