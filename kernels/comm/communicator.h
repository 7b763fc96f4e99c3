#ifndef OPTSTEP_KERNELS_COMM_COMMUNICATOR_H_
#define OPTSTEP_KERNELS_COMM_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kernels/comm/key_value_store.h"

namespace optstep {

enum class ReduceOp { kSum, kMax };

// Element types collectives move.
enum class CommDType { kFloat32, kFloat64, kUint8 };

size_t CommDTypeSize(CommDType dtype);

// Collectives among the ranks of one group (one per session). Buffers live in the memory of the
// device the communicator serves: host memory for "local" and "gloo", the GPU's for "nccl".
// Every rank must issue the same collectives in the same order. Thread-compatible: one thread at
// a time per communicator. Errors are absl::Status: DEADLINE_EXCEEDED after the timeout,
// UNAVAILABLE when a peer is lost (the group is then unusable), INVALID_ARGUMENT for bad sizes.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // In place: every rank ends with the element-wise reduction over ranks (kFloat32 / kFloat64).
  virtual absl::Status AllReduce(void* data, int64_t count, CommDType dtype, ReduceOp op) = 0;
  // Variable-size all-gather: rank r contributes `send` (recv_counts[r] elements); every rank
  // ends with the concatenation in rank order in `recv` (sum of recv_counts elements).
  // In place when `send` is recv + (sum of recv_counts before rank()) elements.
  // REQUIRES: send_count == recv_counts[rank()], recv_counts.size() == world_size().
  virtual absl::Status AllGatherV(const void* send, int64_t send_count, void* recv,
                                  const std::vector<int64_t>& recv_counts, CommDType dtype) = 0;
  // `root`'s buffer is copied to every rank.
  virtual absl::Status Broadcast(void* data, int64_t count, CommDType dtype, int root) = 0;
  // The ring's shift: every rank sends `send` (send_count elements) to rank (rank() + 1) % N and
  // receives its predecessor's (rank() + N - 1) % N `recv_count` elements into `recv` (the
  // buddy copies of docs/design.md, "State redundancy"). Each rank's recv_count must be what its
  // predecessor sends. With one rank, `send` is copied to `recv`. `recv` is written only in the
  // call; on an error its contents are undefined.
  virtual absl::Status RingShift(const void* send, int64_t send_count, void* recv,
                                 int64_t recv_count, CommDType dtype) = 0;
  virtual absl::Status Barrier() = 0;
};

// Forwards every call to `base` (owned): a wrapper overrides only what it changes (a fault to
// inject, a count to keep).
class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(std::unique_ptr<Communicator> base) : base_(std::move(base)) {}

  int rank() const override { return base_->rank(); }
  int world_size() const override { return base_->world_size(); }
  absl::Status AllReduce(void* data, int64_t count, CommDType dtype, ReduceOp op) override {
    return base_->AllReduce(data, count, dtype, op);
  }
  absl::Status AllGatherV(const void* send, int64_t send_count, void* recv,
                          const std::vector<int64_t>& recv_counts, CommDType dtype) override {
    return base_->AllGatherV(send, send_count, recv, recv_counts, dtype);
  }
  absl::Status Broadcast(void* data, int64_t count, CommDType dtype, int root) override {
    return base_->Broadcast(data, count, dtype, root);
  }
  absl::Status RingShift(const void* send, int64_t send_count, void* recv, int64_t recv_count,
                         CommDType dtype) override {
    return base_->RingShift(send, send_count, recv, recv_count, dtype);
  }
  absl::Status Barrier() override { return base_->Barrier(); }

 protected:
  Communicator& base() { return *base_; }

 private:
  const std::unique_ptr<Communicator> base_;
};

struct CommunicatorOptions {
  // "local" (world size 1), "gloo" (CPU, TCP), "nccl" (GPU; --config=cuda builds only).
  std::string kind = "local";
  int rank = 0;
  int world_size = 1;
  // Keys of this group in the store are prefixed with it (e.g. the session id), so several
  // groups can rendezvous through one store.
  std::string prefix;
  std::shared_ptr<KeyValueStore> store;
  // Gloo: the local address peers connect to ("127.0.0.1", a pod IP, a hostname).
  std::string hostname = "127.0.0.1";
  // NCCL: the CUDA device ordinal.
  int device_ordinal = 0;
  // Rendezvous and every collective give up after this.
  absl::Duration timeout = absl::Seconds(60);
  // Gloo: once every rank came to the rendezvous, connecting to them gives up after this (zero,
  // or past `timeout`: the time left of it). A peer that came was listening; a connection that
  // takes longer means it died since (a rank lost in a heal), which would otherwise hold the
  // rendezvous for five times `timeout` (gloo's wait for a first connection).
  absl::Duration connect_timeout = absl::ZeroDuration();
};

// Chooses the collectives for the device whose memory they move (`device_name` as
// Device::name(): "cpu", "cuda:N"): `requested` "auto" is "nccl" on a CUDA device and "gloo"
// otherwise; "gloo" needs host memory and "nccl" a CUDA device. Sets options->kind and, for
// NCCL, options->device_ordinal. INVALID_ARGUMENT names both values for a mismatch.
absl::Status ResolveCommunicatorKind(absl::string_view requested, absl::string_view device_name,
                                     CommunicatorOptions* options);

// Creates and connects a communicator (blocks until every rank has joined, or the timeout).
// Bazel links communicator_factory.cc (local, gloo) or communicator_factory_cuda.cc (also nccl).
absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    const CommunicatorOptions& options);

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_COMM_COMMUNICATOR_H_
