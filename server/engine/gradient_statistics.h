#ifndef OPTSTEP_SERVER_ENGINE_GRADIENT_STATISTICS_H_
#define OPTSTEP_SERVER_ENGINE_GRADIENT_STATISTICS_H_

// The statistics of each owned gradient for the global norm (docs/design.md §3): computed on the
// device worker as soon as the gradient is complete, while the ingest of the others goes on, so
// that after the last commit only the agreement and the update remain. A gradient whose
// statistics were not computed then (or are no longer current) has them computed after the last
// commit, by the same function.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/tensor.h"
#include "server/engine/session_config.h"

namespace optstep {

// What a step computes of an owned gradient before the ranks agree: the REPLICATED mean in place
// (`grad` times the fp32 1/N when the session sums N trainers in trainer order: SumsInTrainerOrder)
// and then its sum of squares and finiteness (Device::ComputeGradientStats). Not idempotent:
// REQUIRES: once per gradient and step, on the device worker.
absl::StatusOr<GradientStats> MeanAndStatistics(const SessionConfig& config, Device& device,
                                                Tensor& grad);

// The record, for the pending step of one session on one rank, of the writes into each owned
// gradient buffer and of the statistics computed during ingest: which version of each buffer (one
// more with every write that changes it) they were computed of, and which parameter a statistics
// task reads now, so that no write goes into that buffer meanwhile. Thread-compatible: the
// Session keeps it under its lock (in its StepBook).
class GradientStatistics {
 public:
  using Result = absl::StatusOr<GradientStats>;

  explicit GradientStatistics(int num_params);

  // A write of elements of `param` begins; `changes`: it writes values (not only resent elements
  // that are skipped). REQUIRES: !reading(param).
  void BeginWrite(int param, bool changes);
  // That write ended. When `complete` (every element of the gradient is in) and no other write
  // of it is in flight, answers the version to compute the statistics of, once per version.
  std::optional<uint64_t> EndWrite(int param, bool complete);
  // A statistics task of `version` of `param` starts: false (it does nothing) when the buffer
  // changed since, or a write of it is in flight. On true, reading(param) until Release.
  bool Claim(int param, uint64_t version);
  // The task ends: `result` is kept when `current` (the step it was posted in is still pending).
  void Release(int param, uint64_t version, bool current, Result result);
  // Whether a statistics task reads `param`'s buffer now (claimed, not yet released).
  bool reading(int param) const { return reading_ == param; }

  // The statistics computed of each parameter's current buffer; unset where none were.
  std::vector<std::optional<Result>> Current() const;
  // Forgets the step (a task that reads stays reading until it is released).
  void Reset();

 private:
  struct Param {
    int writes = 0;        // in flight
    uint64_t version = 0;  // writes that changed the buffer
    std::optional<uint64_t> posted;
    std::optional<uint64_t> computed;  // the version `result` is of
    Result result;
  };

  std::vector<Param> params_;
  int reading_ = -1;  // one task of a session runs at a time (its queue of the device worker)
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_GRADIENT_STATISTICS_H_
