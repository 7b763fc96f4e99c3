#include "server/engine/step_coordinator.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "server/engine/owned_update.h"
#include "server/engine/replica_snapshot.h"

namespace optstep {
namespace {

// "trainer 2" or "trainers 1, 3".
std::string Trainers(const std::vector<int>& trainers) {
  return absl::StrCat(trainers.size() == 1 ? "trainer " : "trainers ",
                      absl::StrJoin(trainers, ", "));
}

// What this rank knows of an aborted step's missing contributions: which trainers had not
// committed (and which of them had not begun), or that every one had, the step being aborted by
// another rank's vote.
std::string MissingTrainers(const StepLedger::Pending& pending, int rank) {
  if (pending.uncommitted.empty()) {
    return absl::StrCat("every trainer had committed on rank ", rank,
                        "; contributions were incomplete on another rank");
  }
  std::string missing = absl::StrCat(Trainers(pending.uncommitted), " of ", pending.num_trainers,
                                     " had not committed on rank ", rank);
  if (!pending.not_begun.empty()) {
    absl::StrAppend(&missing, " (", Trainers(pending.not_begun), " had not begun)");
  }
  return missing;
}

// The factor the gradients are scaled by before the step: c = clip / (norm + 1e-6) when
// clipping is on (clip > 0) and c < 1; otherwise 1.
double ClipScale(double clip, double grad_norm) {
  if (clip <= 0.0) return 1.0;
  return std::min(1.0, clip / (grad_norm + 1e-6));
}

}  // namespace

StepCoordinator::StepCoordinator(Options options, ReplicaState* replica,
                                 std::unique_ptr<Communicator> comm,
                                 std::shared_ptr<FairExecutor> device_worker, StepLedger* ledger)
    : options_(std::move(options)),
      replica_(replica),
      comm_(std::move(comm)),
      device_queue_(std::move(device_worker), options_.session_id, options_.owner),
      ledger_(ledger) {}

absl::StatusOr<std::unique_ptr<StepCoordinator>> StepCoordinator::Create(
    Options options, ReplicaState* replica, std::unique_ptr<Communicator> comm,
    std::shared_ptr<FairExecutor> device_worker, StepLedger* ledger) {
  const int world = replica->layout().world_size;
  const int rank = replica->rank();
  if (comm == nullptr || comm->world_size() != world || comm->rank() != rank) {
    return absl::InternalError(absl::StrCat("session '", options.session_id,
                                            "': communicator does not match rank ", rank, " of ",
                                            world));
  }
  std::unique_ptr<StepCoordinator> coordinator(new StepCoordinator(
      std::move(options), replica, std::move(comm), std::move(device_worker), ledger));
  if (world > 1) {
    // Agree's votes: a float64 per parameter and three more, as fp32 words.
    const int64_t words = (static_cast<int64_t>(replica->num_params()) + 3) * 2;
    OPTSTEP_ASSIGN_OR_RETURN(coordinator->votes_, replica->device().Allocate(DType::kF32, {words}));
  }
  return coordinator;
}

void StepCoordinator::Post(std::function<void()> task) { executor_.Post(std::move(task)); }

absl::Status StepCoordinator::OnDevice(const std::function<absl::Status()>& task,
                                       absl::string_view what) {
  absl::Notification done;
  absl::Status status;
  device_queue_.Post({std::string(what),
                      [&] {
                        status = task();
                        done.Notify();
                      },
                      [&] {
                        status = absl::UnavailableError(
                            absl::StrCat("session '", options_.session_id, "' closed: its ", what,
                                         " was cancelled"));
                        done.Notify();
                      }});
  done.WaitForNotification();
  return status;
}

void StepCoordinator::PostDevice(std::string what, std::function<void()> task) {
  device_queue_.Post({std::move(what), std::move(task), [] {}});
}

absl::Status StepCoordinator::OnDeviceSliced(absl::string_view what, int count,
                                             const std::function<absl::Status(int)>& item,
                                             const SliceLimit& limit) {
  int next = 0;
  while (next < count) {
    const int bound = limit ? std::min(limit(next), count) : count;
    OPTSTEP_RETURN_IF_ERROR(OnDevice(
        [&]() -> absl::Status {
          const absl::Time end = absl::Now() + kDeviceSlice;
          do {
            OPTSTEP_RETURN_IF_ERROR(item(next));
            ++next;
          } while (next < bound && absl::Now() < end);
          // A device that queues its kernels (CUDA) finishes them within the slice.
          return replica_->device().Synchronize();
        },
        what));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const ParamSnapshot>> StepCoordinator::BuildSnapshot(DType dtype,
                                                                                    uint64_t step) {
  std::shared_ptr<ParamSnapshot> snapshot = EmptySnapshot(*replica_, dtype, step);
  OPTSTEP_RETURN_IF_ERROR(
      OnDeviceSliced(absl::StrCat("step ", step, " parameter snapshot"), replica_->num_params(),
                     [&](int p) { return CopyToSnapshot(*replica_, p, *snapshot); }));
  return std::shared_ptr<const ParamSnapshot>(std::move(snapshot));
}

void StepCoordinator::Resolve(ResolutionKind kind) {
  const bool abort = kind == ResolutionKind::kAbort;
  const StepLedger::Pending pending = ledger_->BeginResolution();
  const std::string& id = options_.session_id;
  const int rank = replica_->rank();
  const absl::Time started = absl::Now();
  if (!abort && pending.began) {
    options_.observer->OnPhase(StepObserver::Phase::kIngest, started - *pending.began);
  }
  // 1-2. This rank's part: the REPLICATED mean (the sum is already in trainer order),
  // per-parameter sums of squares and finiteness of the parameters it owns.
  std::vector<double> sums(replica_->num_params(), 0.0);
  bool finite = true;
  const absl::Status local = abort ? absl::OkStatus() : LocalStatistics(pending.step, sums, finite);
  // A rank that cannot compute its part still votes (to abort), so that every rank aborts with
  // it and none waits for it in the collective.
  if (!local.ok()) {
    LOG(ERROR) << "session " << id << " rank " << rank << ": gradient statistics failed: " << local;
  }
  // 3. Agree with the other ranks; the global norm.
  absl::StatusOr<Agreement> agreement = Agree(abort, !local.ok(), sums, finite);
  if (!agreement.ok()) {
    LOG(ERROR) << "session " << id << " rank " << rank
               << ": lost the group: " << agreement.status();
    return LostPeer(pending.step,
                    absl::UnavailableError(absl::StrCat(
                        "session '", id, "': rank ", rank,
                        " lost a peer during step agreement: ", agreement.status().message())));
  }
  if (agreement->failed) {
    return FinishStep(absl::AbortedError(absl::StrCat(
                          "session '", id,
                          "': step aborted: a rank could not compute its "
                          "gradient statistics (see the ranks' logs",
                          local.ok() ? "" : "; here: ", local.message(), "); redo the step")),
                      /*aborted=*/true);
  }
  if (agreement->abort) {
    return FinishStep(absl::AbortedError(absl::StrCat(
                          "session '", id, "': step ", pending.step, " aborted after the ",
                          absl::FormatDuration(options_.step_deadline), " step deadline; ",
                          MissingTrainers(pending, rank), "; redo the step")),
                      /*aborted=*/true);
  }
  StepOutcome outcome;
  outcome.skipped = agreement->skipped;
  outcome.grad_norm = agreement->grad_norm;
  // Past step 1 (also after a heal caught this rank up to it): no step 1 seeds again.
  if (pending.step != 1) seed_masters_ = Tensor();
  // Step 1, even skipped: every shadow starts from its owner's initial masters, which reached the
  // owner alone (InitParameters under OWNERS storage) or were never written to the shadow.
  if (options_.shadow != nullptr && pending.step == 1) {
    absl::Status seeded = SeedShadowMasters();
    if (!seeded.ok()) return LostPeer(pending.step, std::move(seeded));
  }
  if (outcome.skipped) {
    if (pending.step == 1) seed_masters_ = Tensor();  // step 1 ended: no redo seeds again
    return FinishStep(std::move(outcome), /*aborted=*/false);
  }
  const StepSchedule schedule = pending.schedule ? *pending.schedule : replica_->DefaultSchedule();
  // The result is known now: the trainers get it, and each parameter as soon as it is ready.
  const double clip_scale = ClipScale(replica_->config().chain.clip_grad, agreement->grad_norm);
  outcome.clipped = clip_scale < 1.0;
  // The owned gradients go to the buddy while the owned update runs.
  std::unique_ptr<GradientShipment> shipment;
  if (options_.shadow != nullptr) shipment = StartShipment();
  const StreamingSnapshots streaming = StreamEarly(outcome, pending.step);
  std::vector<int> last_ids;
  bool peer_lost = false;
  absl::Status applied = ApplyStep(pending.step, schedule, clip_scale, started, streaming,
                                   shipment.get(), &last_ids, &peer_lost);
  if (!applied.ok()) {
    for (const auto& entry : streaming) entry.second->readiness->Fail(applied);
    if (peer_lost) {
      // Lost after the shipment ended (in the all-gather or the barrier): the shadow has this
      // step's gradients, and another rank may have finished the step, since a collective cut by
      // a rank's death can complete on some ranks and fail on others. The shadow takes the step
      // as the buddies of those ranks did (a redo skips it); the heal brings this rank's
      // counters up to theirs (heal.h, kCatchUp).
      if (shipment != nullptr && shipment->Wait().ok()) {
        UpdateShadow(pending.step, schedule, clip_scale);
      }
      // The step is redone once the group heals, if it can.
      return LostPeer(pending.step, std::move(applied));
    }
    // Part of the state may be stepped: this replica cannot be trusted any more.
    ledger_->MarkBroken();
    return FinishStep(applied, /*aborted=*/false);
  }
  FinishStep(std::move(outcome), /*aborted=*/false, streaming, last_ids);
  if (pending.step == 1) seed_masters_ = Tensor();  // step 1 ended: no redo seeds again
  // The buddy's copy of the predecessor's state follows once the trainers have the step: the
  // gradients it needs are in, and nothing reads the shadow but the coordinator's later tasks.
  if (options_.shadow != nullptr) UpdateShadow(pending.step, schedule, clip_scale);
}

absl::Status StepCoordinator::LocalStatistics(uint64_t step, std::vector<double>& sums,
                                              bool& finite) {
  // After the statistics tasks posted during ingest, on the device worker.
  std::vector<std::optional<GradientStatistics::Result>> early;
  OPTSTEP_RETURN_IF_ERROR(OnDevice(
      [&] {
        early = ledger_->IngestStatistics();
        return absl::OkStatus();
      },
      absl::StrCat("step ", step, " gradient statistics")));
  std::vector<int> rest;  // the owned gradients whose statistics are computed now
  auto take = [&](int p, const GradientStatistics::Result& stats) -> absl::Status {
    OPTSTEP_RETURN_IF_ERROR(stats.status());
    finite = finite && stats->all_finite;
    sums[p] = stats->sum_squares;
    return absl::OkStatus();
  };
  for (int p : replica_->owned()) {
    if (!early[p]) {
      rest.push_back(p);
      continue;
    }
    OPTSTEP_RETURN_IF_ERROR(take(p, *early[p]));
  }
  return OnDeviceSliced(absl::StrCat("step ", step, " gradient statistics"),
                        static_cast<int>(rest.size()), [&](int i) {
                          const int p = rest[i];
                          return take(p, MeanAndStatistics(replica_->config(), replica_->device(),
                                                           replica_->grad(p)));
                        });
}

StepCoordinator::StreamingSnapshots StepCoordinator::StreamEarly(const StepOutcome& outcome,
                                                                 uint64_t step) {
  // Before this step's snapshots are made: the last step's would otherwise stay beside them
  // until the resolution ends (one more copy of the returned parameters per dtype).
  ledger_->ReleaseSnapshots();
  std::vector<StepWaiter> early = ledger_->TakeStreamingWaiters();
  // REPLICATED storage on several ranks: a dtype whose every stream returns owned parameters
  // only needs those.
  const bool holds_others = replica_->config().storage == ParameterStorage::kReplicated &&
                            replica_->layout().world_size > 1;
  std::map<DType, bool> owned_only_by_dtype;
  for (const StepWaiter& w : early) {
    owned_only_by_dtype.emplace(w.dtype, true).first->second &= w.owned_only && holds_others;
  }
  // In the storage of the last step's of the same kind; what is not reused is not kept.
  StreamingSnapshots streaming;
  for (const auto& [dtype, owned_only] : owned_only_by_dtype) {
    std::shared_ptr<ParamSnapshot>& snapshot = streaming[dtype];
    snapshot = snapshots_.Make(*replica_, dtype, step, owned_only);
    snapshot->readiness = std::make_shared<ParamReadiness>();
    ledger_->TrackSnapshot(snapshot);
  }
  snapshots_.Trim();
  for (StepWaiter& w : early) {
    StepOutcome mine = outcome;
    mine.step = step;
    mine.params = streaming[w.dtype];
    w.done(std::move(mine));
  }
  return streaming;
}

absl::Status StepCoordinator::PublishParams(const std::vector<int>& ids,
                                            const StreamingSnapshots& streaming, bool mark) {
  for (const auto& [dtype, snapshot] : streaming) {
    for (int p : ids) OPTSTEP_RETURN_IF_ERROR(CopyToSnapshot(*replica_, p, *snapshot));
    if (mark) snapshot->readiness->MarkReady(ids);
  }
  return absl::OkStatus();
}

absl::StatusOr<StepCoordinator::Agreement> StepCoordinator::Agree(bool abort, bool failed,
                                                                  const std::vector<double>& sums,
                                                                  bool finite) {
  // One all-reduce carries every parameter's sum of squares (only its owner contributes a
  // non-zero value, so the sum is exact), the non-finite, abort and failure votes.
  const size_t n = sums.size();
  std::vector<double> votes(sums);
  votes.push_back(finite ? 0.0 : 1.0);
  votes.push_back(abort ? 1.0 : 0.0);
  votes.push_back(failed ? 1.0 : 0.0);
  if (replica_->layout().world_size > 1) {
    // Collectives move the device's memory (NCCL: the GPU's): the votes go through votes_, as
    // raw fp32 words (a bit copy both ways).
    Device& device = replica_->device();
    const int64_t words = static_cast<int64_t>(votes.size()) * 2;
    OPTSTEP_RETURN_IF_ERROR(device.CopyFromHost(votes.data(), DType::kF32, words, votes_, 0));
    OPTSTEP_RETURN_IF_ERROR(comm_->AllReduce(votes_.data(), static_cast<int64_t>(votes.size()),
                                             CommDType::kFloat64, ReduceOp::kSum));
    OPTSTEP_RETURN_IF_ERROR(device.CopyToHost(votes_, 0, words, DType::kF32, votes.data()));
  }
  Agreement agreement;
  agreement.abort = votes[n + 1] > 0.0;
  agreement.failed = votes[n + 2] > 0.0;
  agreement.skipped = votes[n] > 0.0;
  if (!agreement.abort && !agreement.failed && !agreement.skipped) {
    double total = 0.0;
    for (size_t p = 0; p < n; ++p) total += votes[p];  // parameter order, on every rank
    agreement.grad_norm = std::sqrt(total);
  }
  return agreement;
}

absl::Status StepCoordinator::ApplyStep(uint64_t step, const StepSchedule& schedule,
                                        double clip_scale, absl::Time started,
                                        const StreamingSnapshots& streaming,
                                        GradientShipment* shipment, std::vector<int>* last_ids,
                                        bool* peer_lost) {
  // 5. Each group steps the parameters this rank owns, in group order; every rank advances every
  // group's counter, so they agree. Every kStreamBucketBytes of stepped parameters go out to the
  // streaming snapshots while the next bucket steps.
  constexpr int64_t kStreamBucketBytes = 16 << 20;
  std::vector<int> bucket;
  absl::Status updated;
  if (replica_->owned_applied_step() >= step) {
    // Applied before the step was interrupted: the parameters are this step's already.
    if (!streaming.empty()) bucket = replica_->owned();
  } else {
    const OwnedUpdate update = PlanOwnedUpdate(*replica_, schedule);
    int64_t bucket_bytes = 0;
    updated = OnDeviceSliced(
        absl::StrCat("step ", step, " optimizer"), static_cast<int>(update.work.size()),
        [&](int i) -> absl::Status {
          // 4. Clip (ClipScale), then step.
          OPTSTEP_RETURN_IF_ERROR(ApplyOwnedItem(*replica_, update, i, clip_scale));
          if (streaming.empty()) return absl::OkStatus();
          for (int p : update.work[i].params) {
            bucket.push_back(p);
            bucket_bytes += replica_->numels()[p] * 4;
          }
          if (bucket_bytes < kStreamBucketBytes) return absl::OkStatus();
          OPTSTEP_RETURN_IF_ERROR(replica_->device().Synchronize());
          OPTSTEP_RETURN_IF_ERROR(PublishParams(bucket, streaming));
          bucket.clear();
          bucket_bytes = 0;
          return absl::OkStatus();
        },
        shipment != nullptr ? ShippedBatches(update, shipment) : SliceLimit());
    if (updated.ok()) {
      CountOwnedUpdate(*replica_);
      replica_->set_owned_applied_step(step);
    }
  }
  // The buddy has this step's gradients before any rank can finish the all-gather. (An update
  // that failed on the device breaks the replica, lost peer or not: part of it may be applied.)
  if (shipment != nullptr) {
    absl::Status shipped = shipment->Wait();
    if (!shipped.ok() && updated.ok()) {
      *peer_lost = true;
      return absl::UnavailableError(absl::StrCat(
          "session '", options_.session_id, "': rank ", replica_->rank(),
          " lost a peer shipping step ", step, "'s gradients to its buddy: ", shipped.message()));
    }
  }
  OPTSTEP_RETURN_IF_ERROR(updated);
  // The last bucket (and the gathered parameters) is marked ready by FinishStep.
  *last_ids = bucket;
  if (!bucket.empty()) {
    OPTSTEP_RETURN_IF_ERROR(
        OnDevice([&] { return PublishParams(bucket, streaming, /*mark=*/false); },
                 absl::StrCat("step ", step, " parameters out")));
  }
  const absl::Time gather_started = absl::Now();
  options_.observer->OnPhase(StepObserver::Phase::kStep, gather_started - started);
  // 6. REPLICATED storage: every rank gets every updated parameter, each rank's block of the
  // masters in place. OWNERS storage: nothing is gathered; each trainer gets each parameter from
  // its owner's stream.
  const int rank = replica_->rank();
  if (options_.shadow != nullptr && !replica_->holds_every_master()) {
    // Without the all-gather the ring shift was the last collective, between neighbours only: a
    // rank whose neighbours live could finish a step that the lost rank's neighbours are
    // interrupted in, and the redone step would then wait for it in vain. No rank passes the
    // barrier before every rank's shadow has the step's gradients: all finish the step, or none
    // does.
    absl::Status met = comm_->Barrier();
    if (!met.ok()) {
      *peer_lost = true;
      return absl::UnavailableError(absl::StrCat("session '", options_.session_id, "': rank ", rank,
                                                 " lost a peer after step ", step, ": ",
                                                 met.message()));
    }
  }
  if (replica_->layout().world_size > 1 && replica_->holds_every_master()) {
    const MasterBlocks& masters = replica_->masters();
    absl::Status gathered =
        comm_->AllGatherV(masters.data + masters.offsets[rank], masters.counts[rank], masters.data,
                          masters.counts, CommDType::kFloat32);
    if (!gathered.ok()) {
      *peer_lost = true;
      return absl::UnavailableError(
          absl::StrCat("session '", options_.session_id, "': rank ", rank,
                       " lost a peer during the all-gather: ", gathered.message()));
    }
    options_.observer->OnPhase(StepObserver::Phase::kAllGather, absl::Now() - gather_started);
  }
  std::vector<int> gathered;
  for (int p = 0; p < replica_->num_params(); ++p) {
    if (!replica_->owns(p) && replica_->holds(p)) gathered.push_back(p);
  }
  if (!streaming.empty() && !gathered.empty()) {
    last_ids->insert(last_ids->end(), gathered.begin(), gathered.end());
    OPTSTEP_RETURN_IF_ERROR(
        OnDevice([&] { return PublishParams(gathered, streaming, /*mark=*/false); },
                 absl::StrCat("step ", step, " gathered parameters out")));
  }
  return absl::OkStatus();
}

void StepCoordinator::LostPeer(uint64_t step, absl::Status error) {
  if (options_.shadow != nullptr) {
    ledger_->MarkInterrupted(step);
  } else {
    ledger_->MarkBroken();
  }
  FinishStep(std::move(error), /*aborted=*/false);
}

void StepCoordinator::FinishStep(absl::StatusOr<StepOutcome> outcome, bool aborted,
                                 const StreamingSnapshots& streamed,
                                 const std::vector<int>& last_ids) {
  StepLedger::Ended ended = ledger_->EndStep(outcome);
  // Serialise the parameters once per requested dtype, shared by every trainer.
  std::map<DType, std::shared_ptr<const ParamSnapshot>> snapshots(streamed.begin(), streamed.end());
  if (outcome.ok()) {
    const uint64_t step = outcome->step;
    for (const StepWaiter& w : ended.waiters) {
      auto made = snapshots.find(w.dtype);
      // A partial snapshot (streamed) serves only the waiters of owned parameters.
      if (!w.want_params || (made != snapshots.end() && (!made->second->partial || w.owned_only))) {
        continue;
      }
      absl::StatusOr<std::shared_ptr<const ParamSnapshot>> built = BuildSnapshot(w.dtype, step);
      if (!built.ok()) {
        outcome = built.status();
        break;
      }
      snapshots[w.dtype] = *std::move(built);
      ledger_->TrackSnapshot(snapshots[w.dtype]);
    }
  }
  // Told before any trainer can learn the step's end (its streamed parameters or its result), so
  // that what a trainer sees after its step (metrics, logs) includes it.
  const std::string& id = options_.session_id;
  const int rank = replica_->rank();
  if (!aborted && !outcome.ok()) {
    LOG(ERROR) << "session " << id << " rank " << rank << ": step failed: " << outcome.status();
  }
  using End = StepObserver::StepEnd;
  options_.observer->OnStepEnd(id, ended.step, rank,
                               aborted            ? End::kAborted
                               : !outcome.ok()    ? End::kFailed
                               : outcome->skipped ? End::kSkipped
                                                  : End::kApplied,
                               outcome.ok() ? "" : outcome.status().message());
  // Published for pulls (and replays): the whole snapshots only (a partial one goes back to the
  // pool once its streams end). Complete before that: a pull reads every parameter at once.
  std::map<DType, std::shared_ptr<const ParamSnapshot>> published;
  for (const auto& [dtype, snapshot] : snapshots) {
    if (!snapshot->partial) published.emplace(dtype, snapshot);
  }
  if (outcome.ok()) {
    for (const auto& entry : streamed) entry.second->readiness->MarkReady(last_ids);
  }
  ledger_->EndResolution(outcome.ok() ? &published : nullptr);
  // The streams end only now, the step over on this rank: a trainer that begins the next step at
  // once is not taken for a retry of this one.
  for (const auto& entry : streamed) {
    if (outcome.ok()) {
      entry.second->readiness->End();
    } else {
      entry.second->readiness->Fail(outcome.status());
    }
  }
  for (StepWaiter& w : ended.waiters) {
    if (!outcome.ok()) {
      w.done(outcome.status());
      continue;
    }
    StepOutcome mine = *outcome;
    if (w.want_params) mine.params = snapshots[w.dtype];
    w.done(std::move(mine));
  }
}

}  // namespace optstep
