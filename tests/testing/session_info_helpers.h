#ifndef OPTSTEP_TESTS_TESTING_SESSION_INFO_HELPERS_H_
#define OPTSTEP_TESTS_TESTING_SESSION_INFO_HELPERS_H_

// Small SessionInfo descriptions for client tests. Test-only.

#include <cstdint>
#include <string>
#include <vector>

#include "optstep/v1/session.pb.h"

namespace optstep {
namespace testutil {

struct TestParam {
  std::string name;
  std::vector<uint64_t> shape;
  uint32_t owner = 0;
};

// A SessionInfo with the given parameters and owners, one group per sub-optimizer "adamw".
inline v1::SessionInfo MakeSessionInfo(const std::string& id, uint32_t world_size,
                                       const std::vector<TestParam>& params) {
  v1::SessionInfo info;
  info.set_session_id(id);
  info.mutable_spec()->set_name("test-" + id);
  info.mutable_spec()->set_num_trainers(1);
  info.mutable_spec()->set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
  info.mutable_layout()->set_world_size(world_size);
  v1::GroupInfo* group = info.add_groups();
  group->set_id(0);
  group->set_sub_optimizer("adamw");
  group->set_lr(1e-3);
  group->set_weight_decay(0.01);
  group->set_wd_mult(1.0);
  uint32_t id_counter = 0;
  for (const TestParam& p : params) {
    v1::ParameterSpec* spec = info.mutable_spec()->add_parameters();
    spec->set_name(p.name);
    for (uint64_t d : p.shape) spec->add_shape(d);
    info.mutable_layout()->add_owner(p.owner);
    group->add_param_ids(id_counter++);
  }
  return info;
}

// A SessionSpec of the given parameters (names and shapes; owners are not part of a spec) with
// one AdamW sub-optimizer "adam" at its defaults, SHARDED, `num_trainers` trainers.
inline v1::SessionSpec MakeAdamWSpec(const std::vector<TestParam>& params, uint32_t num_trainers) {
  v1::SessionSpec spec;
  for (const TestParam& p : params) {
    v1::ParameterSpec* param = spec.add_parameters();
    param->set_name(p.name);
    for (uint64_t d : p.shape) param->add_shape(d);
  }
  spec.set_num_trainers(num_trainers);
  spec.set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
  v1::SubOptimizer* sub = spec.mutable_optimizer()->add_sub_optimizers();
  sub->set_name("adam");
  sub->set_kind("adamw");
  return spec;
}

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_TESTING_SESSION_INFO_HELPERS_H_
