// StepCoordinator's part in state redundancy (shadow_state.h, docs/design.md "State
// redundancy"): shipping the owned gradients to the buddy under the owned update, seeding the
// shadows with the owners' initial masters at step 1, and stepping the shadow after the step.

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "glog/logging.h"
#include "server/engine/owned_update.h"
#include "server/engine/step_coordinator.h"

namespace optstep {

std::unique_ptr<GradientShipment> StepCoordinator::StartShipment() {
  if (shipper_ == nullptr) shipper_ = std::make_unique<SerialExecutor>();
  ReplicaState& shadow = options_.shadow->replica();
  return std::make_unique<GradientShipment>(
      comm_.get(), replica_->owned_grads(), replica_->owned_numel(), shadow.owned_grads(),
      shadow.owned_numel(), replica_->masters().counts, shipper_.get());
}

StepCoordinator::SliceLimit StepCoordinator::ShippedBatches(const OwnedUpdate& update,
                                                            GradientShipment* shipment) {
  // needs[i]: how much of the owned gradients batches 0..i read (their views' furthest end).
  auto needs = std::make_shared<std::vector<int64_t>>();
  needs->reserve(update.work.size());
  const float* base = replica_->owned_grads();
  int64_t need = 0;
  for (const OwnedBatch& batch : update.work) {
    for (int p : batch.params) {
      const Tensor& grad = replica_->grad(p);
      need = std::max(need, (grad.f32() - base) + grad.numel());
    }
    needs->push_back(need);
  }
  return [needs, shipment](int next) {
    const absl::StatusOr<int64_t> sent = shipment->WaitSent((*needs)[next]);
    // A failed shipment reads the gradients no more: the update ends, so that the step, which
    // the loss interrupts after it (as one in the all-gather), is not applied in part; its redo
    // skips this rank's update.
    if (!sent.ok()) return static_cast<int>(needs->size());
    return static_cast<int>(std::upper_bound(needs->begin(), needs->end(), *sent) - needs->begin());
  };
}

absl::Status StepCoordinator::SeedShadowMasters() {
  const MasterBlocks& own = replica_->masters();
  const int rank = replica_->rank();
  const int64_t count = own.counts[rank];
  Device& device = replica_->device();
  // The initial masters are kept until step 1 ended here: a redo of step 1 after this rank
  // applied it seeds from them again, not from the masters its update wrote, which the shadow's
  // update would step a second time. (A rank healed in with step 1 applied has none to keep: it
  // took its state from its buddy's shadow, which has step 1 too and drops the seed below.)
  // Copied again while this rank has not applied step 1 (its masters may have been set since:
  // InitParameters, a Load, a heal's import at step 0).
  if (count > 0 && replica_->owned_applied_step() == 0) {
    if (!seed_masters_.defined()) {
      OPTSTEP_ASSIGN_OR_RETURN(seed_masters_, device.Allocate(DType::kF32, {count}));
    }
    const Tensor block(DType::kF32, {count}, own.data + own.offsets[rank], Tensor::Deleter());
    // Synchronized: the collective reads the copy from its own stream (NCCL).
    OPTSTEP_RETURN_IF_ERROR(OnDevice(
        [&] {
          OPTSTEP_RETURN_IF_ERROR(device.Copy(block, seed_masters_));
          return device.Synchronize();
        },
        "step 1: keep the initial masters"));
  }
  const float* send = seed_masters_.defined() ? seed_masters_.f32() : own.data + own.offsets[rank];
  ReplicaState& shadow = options_.shadow->replica();
  const MasterBlocks& copy = shadow.masters();
  const int64_t recv_count = copy.counts[shadow.rank()];
  float* recv = copy.data + copy.offsets[shadow.rank()];
  // A shadow that took step 1 already (its owner's redo, after this rank ended the step) keeps
  // its masters: the seed is received and dropped.
  Tensor dropped;
  if (options_.shadow->step() >= 1 && recv_count > 0) {
    OPTSTEP_ASSIGN_OR_RETURN(dropped, device.Allocate(DType::kF32, {recv_count}));
    recv = dropped.f32();
  }
  absl::Status shifted = comm_->RingShift(send, count, recv, recv_count, CommDType::kFloat32);
  if (shifted.ok()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("session '", options_.session_id, "': rank ", rank,
                                             " lost a peer shipping its initial masters to its "
                                             "buddy: ",
                                             shifted.message()));
}

void StepCoordinator::UpdateShadow(uint64_t step, const StepSchedule& schedule, double clip_scale) {
  ShadowState& shadow = *options_.shadow;
  if (!shadow.CheckUsable().ok() || shadow.step() >= step) return;
  ReplicaState& owner = shadow.replica();
  const OwnedUpdate update = PlanOwnedUpdate(owner, schedule);
  absl::Status stepped =
      OnDeviceSliced(absl::StrCat("step ", step, " shadow of rank ", owner.rank()),
                     static_cast<int>(update.work.size()),
                     [&](int i) { return ApplyOwnedItem(owner, update, i, clip_scale); });
  if (!stepped.ok()) {
    // The step stands (the owner has it); a heal of the owner finds no copy here and falls back
    // to the automatic checkpoints. (UNAVAILABLE: the session closed meanwhile.)
    LOG_IF(ERROR, !absl::IsUnavailable(stepped))
        << "session " << options_.session_id << " rank " << replica_->rank()
        << ": the shadow of rank " << owner.rank() << " failed in step " << step << ": " << stepped;
    shadow.Invalidate(absl::FailedPreconditionError(
        absl::StrCat("session '", options_.session_id, "': the shadow of rank ", owner.rank(),
                     "'s state failed in step ", step, ": ", stepped.message())));
    return;
  }
  CountOwnedUpdate(owner);
  owner.set_owned_applied_step(step);
}

}  // namespace optstep
