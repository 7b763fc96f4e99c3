#include "server/engine/step_contributions.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"

namespace optstep {

StepContributions::StepContributions(GradientMode mode, int num_trainers,
                                     std::vector<int64_t> numels,
                                     const std::vector<std::string>* names)
    : mode_(mode), num_trainers_(num_trainers), numels_(std::move(numels)), names_(names) {
  dense_.assign(numels_.size(), -1);
  for (size_t p = 0; p < numels_.size(); ++p) {
    if (numels_[p] > 0) dense_[p] = num_dense_++;
  }
  committed_.assign(num_trainers_, false);
  elements_.assign(num_trainers_, 0);
  sent_.resize(num_trainers_);
  written_.resize(num_trainers_);
  ranges_of_.assign(num_trainers_, 0);
  int64_t elements = 0;
  for (int64_t numel : numels_) elements += numel;
  max_ranges_ = num_dense_ + elements / kMinPieceElements + kSpareRanges;
}

size_t StepContributions::MapIndex(int trainer, int param) const {
  const size_t dense = static_cast<size_t>(dense_[param]);
  return mode_ == GradientMode::kSharded ? dense
                                         : trainer * static_cast<size_t>(num_dense_) + dense;
}

StepContributions::Coverage& StepContributions::MapFor(int trainer, int param) {
  if (coverage_.empty()) {
    coverage_.resize(mode_ == GradientMode::kSharded
                         ? num_dense_
                         : static_cast<size_t>(num_dense_) * num_trainers_);
  }
  return coverage_[MapIndex(trainer, param)];
}

const StepContributions::Coverage& StepContributions::MapFor(int trainer, int param) const {
  static const Coverage* const kNothing = new Coverage();
  if (coverage_.empty() || dense_[param] < 0) return *kNothing;
  return coverage_[MapIndex(trainer, param)];
}

absl::Status StepContributions::CheckBounds(int param, int64_t offset, int64_t count) const {
  const std::string& name = (*names_)[param];
  const int64_t numel = numels_[param];
  if (count <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("param '", name, "': empty chunk at offset ", offset));
  }
  if (offset < 0 || offset > numel || count > numel - offset) {
    return absl::InvalidArgumentError(absl::StrCat("param '", name, "': chunk [", offset, ", ",
                                                   offset + count, ") exceeds ", numel,
                                                   " elements"));
  }
  return absl::OkStatus();
}

absl::Status StepContributions::AddRange(int trainer, int param, int64_t offset, int64_t count,
                                         std::vector<ElementRange>* fresh) {
  absl::Status bounds = CheckBounds(param, offset, count);
  if (!bounds.ok()) return bounds;
  const std::string& name = (*names_)[param];
  const int64_t end = offset + count;
  Coverage& coverage = MapFor(trainer, param);
  RangeMap& ranges = coverage.ranges;
  // The ranges overlapping [offset, end): from the one before offset (if it reaches past it).
  // Only ranges carried over from an earlier attempt may overlap.
  auto first = ranges.lower_bound(offset);
  if (first != ranges.begin() && std::prev(first)->second.end > offset) first = std::prev(first);
  for (auto it = first; it != ranges.end() && it->first < end; ++it) {
    if (it->second.carried) continue;
    const bool duplicate = it->first == offset && it->second.end == end;
    return absl::InvalidArgumentError(
        absl::StrCat("param '", name, "': chunk [", offset, ", ", end, ") from trainer ", trainer,
                     duplicate ? " duplicates" : " overlaps", " chunk [", it->first, ", ",
                     it->second.end, ") from trainer ", it->second.trainer));
  }
  if (ranges_of_[trainer] >= max_ranges_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "param '", name, "': chunk [", offset, ", ", end, ") from trainer ", trainer, ": its ",
        "gradients of this step came in ", ranges_of_[trainer], " pieces already, the most ",
        num_dense_, " parameters of ", max_ranges_ - num_dense_ - kSpareRanges, " x ",
        kMinPieceElements, " elements allow; send chunks of at least ", kMinPieceElements,
        " elements (but a parameter's last)"));
  }
  const size_t records = ranges.size();
  coverage.covered += Claim(ranges, first, trainer, offset, end, fresh);
  ranges_of_[trainer] += static_cast<int64_t>(ranges.size()) - static_cast<int64_t>(records);
  elements_[trainer] += count;
  started_ = true;
  return absl::OkStatus();
}

int64_t StepContributions::Claim(RangeMap& ranges, RangeMap::iterator it, int trainer,
                                 int64_t offset, int64_t end, std::vector<ElementRange>* fresh) {
  std::vector<ElementRange> gaps;
  std::vector<std::pair<int64_t, Range>> pieces;  // what replaces the carried ranges
  int64_t cursor = offset;
  while (it != ranges.end() && it->first < end) {
    const int64_t start = it->first;
    const Range carried = it->second;
    if (start > cursor) gaps.push_back(ElementRange{cursor, start});
    if (start < offset) pieces.emplace_back(start, Range{offset, trainer, true});
    pieces.emplace_back(std::max(start, offset), Range{std::min(carried.end, end), trainer});
    if (carried.end > end) pieces.emplace_back(end, Range{carried.end, trainer, true});
    cursor = std::min(carried.end, end);
    it = ranges.erase(it);
  }
  if (cursor < end) gaps.push_back(ElementRange{cursor, end});
  for (const auto& [start, range] : pieces) ranges.emplace(start, range);
  int64_t claimed = 0;
  for (const ElementRange& gap : gaps) {
    ranges.emplace(gap.begin, Range{gap.end, trainer});
    claimed += gap.end - gap.begin;
  }
  if (fresh != nullptr) fresh->insert(fresh->end(), gaps.begin(), gaps.end());
  return claimed;
}

bool StepContributions::complete(int param) const {
  const int trainers = mode_ == GradientMode::kSharded ? 1 : num_trainers_;
  for (int t = 0; t < trainers; ++t) {
    if (MapFor(t, param).covered != numels_[param]) return false;
  }
  return true;
}

absl::Status StepContributions::CheckCovered(const RangeMap& ranges, int param, const char* who,
                                             int trainer) const {
  int64_t covered = 0;
  for (const auto& [start, range] : ranges) {
    if (start != covered) break;
    covered = range.end;
  }
  if (covered == numels_[param]) return absl::OkStatus();
  auto gap_end = ranges.upper_bound(covered);
  const int64_t missing_end = gap_end == ranges.end() ? numels_[param] : gap_end->first;
  return absl::InvalidArgumentError(absl::StrCat(
      "param '", (*names_)[param], "': gradient elements [", covered, ", ", missing_end, ") of ",
      numels_[param], " missing", who, trainer >= 0 ? absl::StrCat(" ", trainer) : ""));
}

absl::Status StepContributions::CheckTrainerComplete(int trainer) const {
  if (mode_ == GradientMode::kSharded) return absl::OkStatus();
  for (int p = 0; p < static_cast<int>(numels_.size()); ++p) {
    absl::Status status = CheckCovered(MapFor(trainer, p).ranges, p, " from trainer", trainer);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status StepContributions::CheckAllComplete() const {
  if (mode_ == GradientMode::kReplicated) return absl::OkStatus();
  for (int p = 0; p < static_cast<int>(numels_.size()); ++p) {
    absl::Status status = CheckCovered(MapFor(0, p).ranges, p, " (all trainers committed)", -1);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

void StepContributions::AddDigests(int trainer, const ContributionDigest& sent,
                                   const ContributionDigest& written) {
  sent_[trainer].Merge(sent);
  written_[trainer].Merge(written);
}

void StepContributions::Commit(int trainer) {
  if (!committed_[trainer]) {
    committed_[trainer] = true;
    ++num_committed_;
  }
}

void StepContributions::DropTrainer(int trainer) {
  if (mode_ == GradientMode::kReplicated) {
    for (size_t p = 0; p < numels_.size() && !coverage_.empty(); ++p) {
      if (dense_[p] < 0) continue;
      for (auto& [start, range] : MapFor(trainer, static_cast<int>(p)).ranges) {
        range.carried = true;
      }
    }
  } else {
    for (Coverage& coverage : coverage_) {
      RangeMap& ranges = coverage.ranges;
      for (auto it = ranges.begin(); it != ranges.end();) {
        if (it->second.trainer != trainer) {
          ++it;
          continue;
        }
        coverage.covered -= it->second.end - it->first;
        --ranges_of_[trainer];
        it = ranges.erase(it);
      }
    }
    written_[trainer] = ContributionDigest();  // overwritten by the next attempt
  }
  sent_[trainer] = ContributionDigest();
  if (committed_[trainer]) {
    committed_[trainer] = false;
    --num_committed_;
  }
  elements_[trainer] = 0;
}

void StepContributions::Reset() {
  for (Coverage& coverage : coverage_) {
    coverage.ranges.clear();
    coverage.covered = 0;
  }
  committed_.assign(num_trainers_, false);
  elements_.assign(num_trainers_, 0);
  sent_.assign(num_trainers_, ContributionDigest());
  written_.assign(num_trainers_, ContributionDigest());
  ranges_of_.assign(num_trainers_, 0);
  num_committed_ = 0;
  started_ = false;
}

}  // namespace optstep
