// Fuzz target for the conversion of CreateSession's request (server/rpc/convert.h), the first
// thing done with a client's session definition, and for the routing of its parameters to
// sub-optimizers and groups (server/optim/routing.h) that session creation does next. The first
// input byte picks the message the rest parses as (binary protobuf):
// - even: a SessionSpec, through SessionConfigFromProto and, if accepted, RouteParameters;
// - odd: a StepHeader, through StepBeginFromProto.
// Besides "no crash, no sanitizer report", it checks what the conversion promises: an accepted
// spec has named, unique parameters with dimensions in [1, 2^40] and at most 2^40 elements,
// 1 to 4096 trainers, the same result a second time; its routing puts every parameter in
// exactly one group, in ascending order, with a valid sub-optimizer; every refusal is
// INVALID_ARGUMENT or UNIMPLEMENTED with a message.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "optstep/v1/optimizer_service.pb.h"
#include "optstep/v1/session.pb.h"
#include "server/optim/routing.h"
#include "server/rpc/convert.h"
#include "tests/fuzz/fuzz_util.h"

namespace optstep {
namespace {

const bool kQuietProtobuf = fuzz::QuietProtobuf();

using fuzz::Check;

void CheckRefusal(const absl::Status& status) {
  Check(status.code() == absl::StatusCode::kInvalidArgument ||
        status.code() == absl::StatusCode::kUnimplemented);
  Check(!status.message().empty());
}

void CheckRouting(const SessionConfig& config) {
  absl::StatusOr<std::vector<ParamGroup>> groups = RouteParameters(config.chain, config.params);
  if (!groups.ok()) {
    CheckRefusal(groups.status());
    return;
  }
  std::vector<int> seen(config.params.size(), 0);
  for (size_t g = 0; g < groups->size(); ++g) {
    const ParamGroup& group = (*groups)[g];
    Check(group.id == static_cast<int>(g));
    Check(group.sub_optimizer >= 0 &&
          group.sub_optimizer < static_cast<int>(config.chain.sub_optimizers.size()));
    Check(!group.param_ids.empty());
    for (size_t i = 0; i < group.param_ids.size(); ++i) {
      const int id = group.param_ids[i];
      Check(id >= 0 && id < static_cast<int>(seen.size()));
      Check(i == 0 || group.param_ids[i - 1] < id);
      ++seen[id];
    }
  }
  for (int count : seen) Check(count == 1);
  // Every rank must build the identical list.
  absl::StatusOr<std::vector<ParamGroup>> again = RouteParameters(config.chain, config.params);
  Check(again.ok() && again->size() == groups->size());
  for (size_t g = 0; g < groups->size(); ++g) {
    Check((*again)[g].param_ids == (*groups)[g].param_ids);
    Check((*again)[g].sub_optimizer == (*groups)[g].sub_optimizer);
  }
}

void FuzzSessionSpec(const v1::SessionSpec& spec) {
  absl::StatusOr<SessionConfig> config = SessionConfigFromProto(spec);
  if (!config.ok()) {
    CheckRefusal(config.status());
    return;
  }
  Check(config->params.size() == static_cast<size_t>(spec.parameters_size()));
  std::set<std::string> names;
  for (const ParamInfo& param : config->params) {
    Check(!param.name.empty() && names.insert(param.name).second);
    int64_t numel = 1;
    for (int64_t d : param.shape) {
      Check(d >= 1 && d <= (int64_t{1} << 40));
      numel *= d;
      Check(numel <= (int64_t{1} << 40));
    }
  }
  Check(config->num_trainers >= 1 && config->num_trainers <= 4096);
  absl::StatusOr<SessionConfig> again = SessionConfigFromProto(spec);
  Check(again.ok() && again->definition_key == config->definition_key);
  CheckRouting(*config);
}

void FuzzStepHeader(const v1::StepHeader& header) {
  absl::StatusOr<StepBegin> begin = StepBeginFromProto(header);
  if (!begin.ok()) {
    CheckRefusal(begin.status());
    return;
  }
  Check(begin->step == header.step() && begin->step >= 1);
  Check(begin->return_dtype == DType::kF32 || begin->return_dtype == DType::kBF16);
}

}  // namespace
}  // namespace optstep

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t* message = data + 1;
  const int length = static_cast<int>(size - 1);
  if (data[0] & 1) {
    optstep::v1::StepHeader header;
    if (header.ParseFromArray(message, length)) optstep::FuzzStepHeader(header);
  } else {
    optstep::v1::SessionSpec spec;
    if (spec.ParseFromArray(message, length)) optstep::FuzzSessionSpec(spec);
  }
  return 0;
}
