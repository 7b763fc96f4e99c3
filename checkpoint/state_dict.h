#ifndef OPTSTEP_CHECKPOINT_STATE_DICT_H_
#define OPTSTEP_CHECKPOINT_STATE_DICT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "kernels/tensor.h"

namespace optstep {

// One tensor of a session's state dict, on the host. Keys (docs/design.md §5):
//   "param/<name>"                              fp32 master
//   "state/<sub-optimizer>/<name>/<key>"        fp32 optimizer state of a parameter
//   "state/<sub-optimizer>/group<id>/step"      int64 0-d: the group's applied-step counter
//   "meta/step", "meta/skipped_steps"           int64 0-d: the session's step counters
//   "meta/masters_step"                         int64 0-d, between ranks only: masters ahead
struct StateTensor {
  enum class Type { kF32, kI64 };
  Type type = Type::kF32;
  Shape shape;
  std::string bytes;  // little-endian, NumElements(shape) elements
};

using StateDict = std::map<std::string, StateTensor>;

// Whether `key` is a group's step counter, "state/<sub-optimizer>/group<id>/step" (<id> one or
// more decimal digits). It is one, whatever the session's parameters are named: a parameter
// named "group0" has no state tensor "step".
bool IsGroupStepKey(const std::string& key);

// The exact parameter name a per-parameter key belongs to ("param/<name>" or
// "state/<sub-optimizer>/<name>/<key>"); nullopt for group counters (IsGroupStepKey), "meta/..."
// keys and malformed ones. Parameters are matched by this exact name, never by suffix (spec §7.3).
std::optional<std::string> ParamNameOfKey(const std::string& key);

// The step a state dict sets: "meta/step", a 0-d int64 counter that is not negative; nullopt
// without one (a reader checks it further).
std::optional<uint64_t> StateDictStep(const StateDict& state);

}  // namespace optstep

#endif  // OPTSTEP_CHECKPOINT_STATE_DICT_H_
