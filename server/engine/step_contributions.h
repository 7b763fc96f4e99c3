#ifndef OPTSTEP_SERVER_ENGINE_STEP_CONTRIBUTIONS_H_
#define OPTSTEP_SERVER_ENGINE_STEP_CONTRIBUTIONS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/dtype.h"
#include "server/engine/contribution_digest.h"
#include "server/engine/session_config.h"

namespace optstep {

// A trainer's handle on the step it began. Obtained from Session::Begin; used for its chunks and
// its commit. Becomes stale (ABORTED) when the step is aborted or the trainer begins again.
struct StepHandle {
  int trainer = 0;
  uint64_t step = 0;
  uint64_t generation = 0;  // session generation when begun
  uint64_t attempt = 0;     // trainer's attempt number within the generation
  DType return_dtype = DType::kF32;
  bool return_params = true;
  bool stream_params = false;
  bool return_owned = false;  // StepBegin::return_owned
  // The trainer already committed this step (a retry after a broken stream), or the step was
  // already applied (replay): chunks are not applied but digested into `resent`, and the commit
  // waits for / returns the result when they are the bytes the trainer committed before
  // (FAILED_PRECONDITION otherwise).
  bool retry = false;
  bool replay = false;
  // Retry or replay: the digest of the chunks sent again, shared by the copies of this handle;
  // the Session's lock guards it.
  std::shared_ptr<ContributionDigest> resent;
};

// Elements [begin, end) of one parameter.
struct ElementRange {
  int64_t begin = 0;
  int64_t end = 0;
  bool operator==(const ElementRange& o) const { return begin == o.begin && end == o.end; }
};

// Bookkeeping of one pending step: which element ranges of which parameter each trainer sent,
// the digests of the bytes (ContributionDigest), and which trainers committed. Enforces the
// coverage rules of docs/design.md §3; holds no gradient data. Thread-compatible (the Session
// guards it).
//
// A trainer that begins the step again (after a broken stream) resends. SHARDED: what it sent
// before is forgotten and overwritten. REPLICATED: what it sent before was already summed into
// the parameter's one gradient buffer and cannot be taken out, so it is carried over; resent
// elements that were carried are taken as the same values and skipped; the commit checks that
// they were (SameResend), so that a resend with other values is refused rather than summed in
// part.
class StepContributions {
 public:
  // `numels[p]` and `names[p]` describe parameter p; `names` must outlive this object.
  StepContributions(GradientMode mode, int num_trainers, std::vector<int64_t> numels,
                    const std::vector<std::string>* names);

  // Records that `trainer` sent elements [offset, offset + count) of `param`, and appends to
  // `fresh` (when not null) the parts whose values are new: all of it, but for the parts a
  // previous attempt of the trainer already sent (REPLICATED; see above), in ascending order.
  // INVALID_ARGUMENT: empty chunk, range outside the parameter, a duplicated range, or a range
  // overlapping one sent earlier in this attempt (SHARDED: by any trainer; REPLICATED: by the
  // same trainer). RESOURCE_EXHAUSTED once the trainer's pieces of this step number
  // max_ranges(): each is a record here, and one-element chunks would make a record of each
  // element (REPLICATED: carried over to its later attempts too).
  // REQUIRES: 0 <= trainer < num_trainers, 0 <= param < number of parameters, !committed(trainer).
  absl::Status AddRange(int trainer, int param, int64_t offset, int64_t count,
                        std::vector<ElementRange>* fresh = nullptr);

  // INVALID_ARGUMENT unless [offset, offset + count) is a non-empty range of `param`.
  absl::Status CheckBounds(int param, int64_t offset, int64_t count) const;

  // REPLICATED: every element of every parameter from `trainer`; SHARDED: always OK (coverage is
  // a property of all trainers together). INVALID_ARGUMENT names the first missing range.
  absl::Status CheckTrainerComplete(int trainer) const;
  // SHARDED: the trainers together covered every element of every parameter.
  absl::Status CheckAllComplete() const;
  // Whether every element of `param` was recorded: SHARDED, by the trainers together;
  // REPLICATED, by every trainer (ranges carried over from an earlier attempt count).
  bool complete(int param) const;

  // Records the digests of a chunk `trainer` sent in its current attempt (`sent`: all of it) and
  // of the part of it that was written to the gradient buffer (`written`: its fresh ranges).
  void AddDigests(int trainer, const ContributionDigest& sent, const ContributionDigest& written);
  // The digest of what `trainer` sent in its current attempt.
  const ContributionDigest& digest(int trainer) const { return sent_[trainer]; }
  // Whether what `trainer` sent in its current attempt is what its attempts wrote to the
  // gradient buffer: REPLICATED, the elements carried over from an earlier attempt (and skipped)
  // were resent with the same values. REQUIRES: CheckTrainerComplete(trainer) is OK.
  bool SameResend(int trainer) const { return sent_[trainer].SameAs(written_[trainer]); }

  void Commit(int trainer);
  // The trainer begins again: forgets its commit and what it sent (SHARDED) or carries what it
  // sent over to the next attempt (REPLICATED).
  void DropTrainer(int trainer);
  void Reset();

  bool committed(int trainer) const { return committed_[trainer]; }
  bool all_committed() const { return num_committed_ == num_trainers_; }
  // Whether any trainer sent anything for this step.
  bool started() const { return started_; }
  // Elements `trainer` sent in its current attempt (resent carried ones included).
  int64_t elements_from(int trainer) const { return elements_[trainer]; }

  // The pieces one trainer's gradients of a step may come in: one a parameter, one per
  // kMinPieceElements of all of them, and kSpareRanges more (chunks cut at other sizes, resends).
  static constexpr int64_t kMinPieceElements = 4096;  // 16 KiB of fp32
  static constexpr int64_t kSpareRanges = 1024;
  int64_t max_ranges() const { return max_ranges_; }

 private:
  struct Range {
    int64_t end;
    int trainer;
    bool carried = false;  // sent by an earlier attempt of the trainer (REPLICATED)
  };
  using RangeMap = std::map<int64_t, Range>;  // start -> range
  struct Coverage {
    RangeMap ranges;
    int64_t covered = 0;  // the elements `ranges` cover
  };

  // SHARDED: one map per parameter with elements here; REPLICATED: one per (trainer, such
  // parameter). Made when the first range arrives (a session costs nothing for them until its
  // trainers send), and kept across steps. REQUIRES for MapIndex and the mutable MapFor: the
  // parameter has elements here.
  size_t MapIndex(int trainer, int param) const;
  Coverage& MapFor(int trainer, int param);
  // An empty one when nothing was sent.
  const Coverage& MapFor(int trainer, int param) const;
  // Records [offset, end) for this attempt: the carried ranges inside it (from `it`, the first
  // range overlapping it, or where it would go) are claimed and the gaps between them recorded
  // and appended to `fresh` (may be null); answers how many elements those gaps hold. REQUIRES:
  // every range overlapping it is carried.
  int64_t Claim(RangeMap& ranges, RangeMap::iterator it, int trainer, int64_t offset, int64_t end,
                std::vector<ElementRange>* fresh);
  absl::Status CheckCovered(const RangeMap& ranges, int param, const char* who, int trainer) const;

  const GradientMode mode_;
  const int num_trainers_;
  const std::vector<int64_t> numels_;
  const std::vector<std::string>* const names_;
  std::vector<int> dense_;  // by parameter: its index among those with elements, or -1
  int num_dense_ = 0;
  std::vector<Coverage> coverage_;  // by MapIndex; empty until the first range
  std::vector<bool> committed_;
  std::vector<int64_t> elements_;
  std::vector<ContributionDigest> sent_;     // per trainer, its current attempt
  std::vector<ContributionDigest> written_;  // per trainer, every attempt's fresh ranges
  std::vector<int64_t> ranges_of_;           // per trainer, the records of its ranges
  int64_t max_ranges_ = 0;
  int num_committed_ = 0;
  bool started_ = false;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_STEP_CONTRIBUTIONS_H_
