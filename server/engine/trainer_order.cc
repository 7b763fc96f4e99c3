#include "server/engine/trainer_order.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace optstep {

TrainerOrder::TrainerOrder(int num_trainers, std::vector<int64_t> numels)
    : num_trainers_(num_trainers),
      numels_(std::move(numels)),
      turn_(numels_.size(), 0),
      added_(numels_.size(), 0) {}

void TrainerOrder::Wait(WaitingChunk chunk) { waiting_.push_back(std::move(chunk)); }

std::vector<WaitingChunk> TrainerOrder::Added(int param, int64_t count) {
  added_[param] += count;
  std::vector<WaitingChunk> ready;
  if (added_[param] < numels_[param] || turn_[param] >= num_trainers_) return ready;
  const int next = ++turn_[param];
  added_[param] = 0;
  auto first = std::stable_partition(waiting_.begin(), waiting_.end(), [&](const WaitingChunk& c) {
    return !(c.param == param && c.handle.trainer == next);
  });
  ready.assign(std::make_move_iterator(first), std::make_move_iterator(waiting_.end()));
  waiting_.erase(first, waiting_.end());
  return ready;
}

std::vector<WaitingChunk> TrainerOrder::TakeWaiting(int trainer) {
  auto first = std::stable_partition(waiting_.begin(), waiting_.end(), [&](const WaitingChunk& c) {
    return c.handle.trainer != trainer;
  });
  std::vector<WaitingChunk> taken(std::make_move_iterator(first),
                                  std::make_move_iterator(waiting_.end()));
  waiting_.erase(first, waiting_.end());
  return taken;
}

std::vector<WaitingChunk> TrainerOrder::Reset() {
  std::fill(turn_.begin(), turn_.end(), 0);
  std::fill(added_.begin(), added_.end(), 0);
  std::vector<WaitingChunk> all = std::move(waiting_);
  waiting_.clear();
  return all;
}

}  // namespace optstep
