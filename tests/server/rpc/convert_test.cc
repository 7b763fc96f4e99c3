// Validation of requests at the RPC boundary: each malformed request names the field, the
// parameter and the values.

#include "server/rpc/convert.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

v1::SessionSpec Spec(const std::string& text) {
  v1::SessionSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &spec)) << text;
  return spec;
}

const char kValid[] = R"pb(
  name: "mlp"
  parameters {
    name: "fc1.weight"
    shape: [ 8, 4 ]
  }
  parameters {
    name: "fc1.bias"
    shape: [ 8 ]
  }
  num_trainers: 2
  gradient_mode: GRADIENT_MODE_REPLICATED
  step_deadline_ms: 1500
  optimizer {
    sub_optimizers {
      name: "adam"
      kind: "adamw"
      adamw { lr: 0.01 beta2: 0.95 decoupled: false }
    }
    clip_grad: 0.5
  }
)pb";

TEST(ConvertTest, ValidSpecConverts) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionConfig config, SessionConfigFromProto(Spec(kValid)));
  EXPECT_EQ(config.name, "mlp");
  ASSERT_EQ(config.params.size(), 2u);
  EXPECT_EQ(config.params[0].shape, (Shape{8, 4}));
  EXPECT_EQ(config.num_trainers, 2);
  EXPECT_EQ(config.mode, GradientMode::kReplicated);
  EXPECT_EQ(config.step_deadline, absl::Milliseconds(1500));
  ASSERT_EQ(config.chain.sub_optimizers.size(), 1u);
  const AdamWConfig& adam = config.chain.sub_optimizers[0].adamw;
  EXPECT_EQ(adam.lr, 0.01);
  EXPECT_EQ(adam.beta1, 0.9);  // default
  EXPECT_EQ(adam.beta2, 0.95);
  EXPECT_FALSE(adam.decoupled);
  EXPECT_EQ(config.chain.clip_grad, 0.5);
  EXPECT_FALSE(config.definition_key.empty());
}

// The storage is part of the definition; REPLICATED spelled out is the default's definition,
// so that a trainer attaching by name, or a checkpoint saved before the field existed, matches
// either spelling.
TEST(ConvertTest, ParameterStorageConvertsAndTheDefaultSpelledOutIsTheSameDefinition) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionConfig unspecified, SessionConfigFromProto(Spec(kValid)));
  EXPECT_EQ(unspecified.storage, ParameterStorage::kReplicated);
  v1::SessionSpec spec = Spec(kValid);
  spec.set_parameter_storage(v1::PARAMETER_STORAGE_REPLICATED);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionConfig replicated, SessionConfigFromProto(spec));
  EXPECT_EQ(replicated.storage, ParameterStorage::kReplicated);
  EXPECT_EQ(replicated.definition_key, unspecified.definition_key);
  spec.set_parameter_storage(v1::PARAMETER_STORAGE_OWNERS);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionConfig owners, SessionConfigFromProto(spec));
  EXPECT_EQ(owners.storage, ParameterStorage::kOwners);
  EXPECT_NE(owners.definition_key, unspecified.definition_key);
  spec.set_parameter_storage(static_cast<v1::ParameterStorage>(7));
  EXPECT_THAT(SessionConfigFromProto(spec).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "parameter_storage 7 must be REPLICATED or OWNERS"));
}

TEST(ConvertTest, MalformedSessionsAreRefused) {
  struct Row {
    const char* text;
    absl::StatusCode code;
    const char* message;
  };
  const Row rows[] = {
      {"num_trainers: 1 gradient_mode: GRADIENT_MODE_SHARDED optimizer { preset: 'adam' }",
       absl::StatusCode::kInvalidArgument, "declares no parameters"},
      {"parameters { name: 'w' shape: [ 4, 0 ] } num_trainers: 1 gradient_mode: "
       "GRADIENT_MODE_SHARDED optimizer { preset: 'adam' }",
       absl::StatusCode::kInvalidArgument, "param 'w': dimension 0"},
      {"parameters { name: 'w' shape: [ 4 ] } parameters { name: 'w' shape: [ 4 ] } "
       "num_trainers: 1 gradient_mode: GRADIENT_MODE_SHARDED optimizer { preset: 'adam' }",
       absl::StatusCode::kInvalidArgument, "param 'w': declared twice"},
      {"parameters { name: '' shape: [ 4 ] } num_trainers: 1 gradient_mode: "
       "GRADIENT_MODE_SHARDED optimizer { preset: 'adam' }",
       absl::StatusCode::kInvalidArgument, "parameter 0: name is empty"},
      {"parameters { name: 'w' shape: [ 4 ] } num_trainers: 0 gradient_mode: "
       "GRADIENT_MODE_SHARDED optimizer { preset: 'adam' }",
       absl::StatusCode::kInvalidArgument, "num_trainers = 0"},
      {"parameters { name: 'w' shape: [ 4 ] } num_trainers: 1 optimizer { preset: 'adam' }",
       absl::StatusCode::kInvalidArgument, "gradient_mode 0"},
      {"parameters { name: 'w' shape: [ 4 ] } num_trainers: 1 gradient_mode: "
       "GRADIENT_MODE_SHARDED optimizer { preset: 'adagrad' }",
       absl::StatusCode::kInvalidArgument, "unknown preset 'adagrad'"},
      {"parameters { name: 'w' shape: [ 4 ] } num_trainers: 1 gradient_mode: "
       "GRADIENT_MODE_SHARDED optimizer { }",
       absl::StatusCode::kInvalidArgument, "give a preset or at least one sub_optimizer"},
      {"parameters { name: 'w' shape: [ 4 ] } num_trainers: 1 gradient_mode: "
       "GRADIENT_MODE_SHARDED optimizer { sub_optimizers { name: 'x' kind: 'sgd' adamw { } } }",
       absl::StatusCode::kInvalidArgument, "sub_optimizer 'x': options do not match kind 'sgd'"},
      {"parameters { name: 'qkv' shape: [ 10, 4 ] qkv { num_query_groups: 1 q_per_group: 2 "
       "head_dim: 2 } } num_trainers: 1 gradient_mode: GRADIENT_MODE_SHARDED optimizer { preset: "
       "'adam' }",
       absl::StatusCode::kInvalidArgument, "param 'qkv': qkv split"},
      {"parameters { name: 'w' shape: [ 4 ] } num_trainers: 1 gradient_mode: "
       "GRADIENT_MODE_SHARDED optimizer { sub_optimizers { name: 'm' kind: 'soap' muon { } } }",
       absl::StatusCode::kInvalidArgument, "sub_optimizer 'm': options do not match kind 'soap'"},
      {"parameters { name: 'w' shape: [ 4 ] } num_trainers: 1 gradient_mode: "
       "GRADIENT_MODE_SHARDED optimizer { preset: 'muon' mup_width_mult: -2 }",
       absl::StatusCode::kInvalidArgument, "mup_width_mult = -2"},
      {"parameters { name: 'w' shape: [ 4 ] } num_trainers: 1 gradient_mode: "
       "GRADIENT_MODE_SHARDED optimizer { sub_optimizers { name: 'l' kind: 'lion' lion { "
       "weight_decay_mode: 7 } } }",
       absl::StatusCode::kInvalidArgument, "sub_optimizer 'l': weight_decay_mode 7"},
  };
  for (const Row& row : rows) {
    EXPECT_THAT(SessionConfigFromProto(Spec(row.text)).status(), StatusIs(row.code, row.message))
        << row.text;
  }
}

// Names reach logs, messages and state-dict keys: control characters and unbounded lengths are
// refused, the name shown escaped and cut short.
// A session created now has a step deadline of 0 or at least 100 ms; one saved before that bound
// (restored, or rebuilt on a rank that heals in) keeps the deadline it had.
TEST(ConvertTest, TheDeadlineBoundOfNewSessionsSparesSavedOnes) {
  v1::SessionSpec spec = Spec(kValid);
  spec.set_step_deadline_ms(50);
  EXPECT_THAT(CheckNewSessionSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "step_deadline_ms = 50 must be 0 (the server's default) or at least 100"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionConfig config, SessionConfigFromProto(spec));
  EXPECT_EQ(config.step_deadline, absl::Milliseconds(50));
  for (uint64_t allowed : {0, 100, 1500, 3600 * 1000}) {
    spec.set_step_deadline_ms(allowed);
    EXPECT_THAT(CheckNewSessionSpec(spec), IsOk()) << allowed;
  }
  // A session saved before the hour's bound is restored with the bound; before, its restore was
  // refused, and the group lost the session.
  for (uint64_t saved : {uint64_t{2} * 3600 * 1000, ~uint64_t{0}}) {
    spec.set_step_deadline_ms(saved);
    EXPECT_THAT(CheckNewSessionSpec(spec),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         absl::StrCat("step_deadline_ms = ", saved, " must be at most 3600000")));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(config, SessionConfigFromProto(spec));
    EXPECT_EQ(config.step_deadline, absl::Hours(1)) << saved;
  }
}

// A new session's chain declares at most 64 sub-optimizers (unused ones are accepted, and each
// lists every tensor of a state dict exported by sub-optimizer); a saved one with more is still
// restored.
TEST(ConvertTest, ANewSessionsChainDeclaresAtMost64SubOptimizers) {
  v1::SessionSpec spec = Spec(kValid);
  for (int i = 1; i <= 64; ++i) {
    v1::SubOptimizer* sub = spec.mutable_optimizer()->add_sub_optimizers();
    sub->set_name(absl::StrCat("unused", i));
    sub->set_kind("sgd");
  }
  EXPECT_THAT(CheckNewSessionSpec(spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                                  "optimizer: 65 sub-optimizers (at most 64)"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionConfig config, SessionConfigFromProto(spec));
  EXPECT_EQ(config.chain.sub_optimizers.size(), 65u);
  spec.mutable_optimizer()->mutable_sub_optimizers()->RemoveLast();
  EXPECT_THAT(CheckNewSessionSpec(spec), IsOk());
}

// The routing bounds are a new session's: a session saved with more rules, or longer globs, is
// still restored and healed in (before, its restore was refused and the group lost it).
TEST(ConvertTest, TheRoutingBoundsOfNewSessionsSpareSavedOnes) {
  v1::SessionSpec spec = Spec(kValid);
  for (int i = 0; i < 257; ++i) {
    v1::RoutingRule* rule = spec.mutable_optimizer()->add_rules();
    rule->set_name_glob(i == 0 ? std::string(2000, '*') : "fc*");
    rule->set_sub_optimizer("adam");
  }
  EXPECT_THAT(CheckNewSessionSpec(spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                                  "optimizer: 257 routing rules (at most 256)"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionConfig config, SessionConfigFromProto(spec));
  EXPECT_EQ(config.chain.rules.size(), 257u);
  spec.mutable_optimizer()->mutable_rules()->RemoveLast();
  EXPECT_THAT(CheckNewSessionSpec(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, "optimizer: rule 0: name_glob '***"));
  spec.mutable_optimizer()->mutable_rules(0)->set_name_glob("fc1.*");
  EXPECT_THAT(CheckNewSessionSpec(spec), IsOk());
}

TEST(ConvertTest, NamesWithControlCharactersOrOverTheirBoundAreRefused) {
  v1::SessionSpec spec = Spec(kValid);
  spec.set_name("run\n\x1b[2J");
  EXPECT_THAT(SessionConfigFromProto(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "session name 'run\\n\\x1b[2J' contains the control character '\\n' "
                       "at byte 3"));
  spec = Spec(kValid);
  spec.set_name(std::string(256, 's'));
  EXPECT_THAT(SessionConfigFromProto(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, "has 256 bytes (at most 255)"));
  spec = Spec(kValid);
  spec.mutable_parameters(1)->set_name("fc1.bias\r");
  EXPECT_THAT(SessionConfigFromProto(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "parameter 1: name 'fc1.bias\\r' contains the control character"));
  spec = Spec(kValid);
  spec.mutable_parameters(0)->set_name(std::string(100000, 'p'));
  const absl::Status long_name = SessionConfigFromProto(spec).status();
  EXPECT_THAT(long_name, StatusIs(absl::StatusCode::kInvalidArgument,
                                  "...(100000 bytes)' has 100000 bytes (at most 1024)"));
  EXPECT_LT(long_name.message().size(), 256u);
  spec = Spec(kValid);
  spec.mutable_parameters(0)->set_name(std::string(1024, 'p'));
  EXPECT_THAT(SessionConfigFromProto(spec), IsOk());
  spec = Spec(kValid);
  spec.mutable_optimizer()->mutable_sub_optimizers(0)->set_name("adam\x7f");
  EXPECT_THAT(SessionConfigFromProto(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, "sub_optimizer name 'adam\\x7f'"));
}

TEST(ConvertTest, EmergingOptimizerOptionsConvert) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      SessionConfig config, SessionConfigFromProto(Spec(R"pb(
        parameters {
          name: "w"
          shape: [ 8, 4 ]
        }
        num_trainers: 1
        gradient_mode: GRADIENT_MODE_SHARDED
        optimizer {
          sub_optimizers {
            name: "m"
            kind: "dist_muon"
            muon {
              lr: 0.02
              momentum: 0.9
              nesterov: true
              weight_decay: 0.1
              weight_decay_mode: WEIGHT_DECAY_MODE_INDEPENDENT
              coefficient_type: "custom"
              custom_coefficients: [ 3, -3, 1 ]
              num_ns_steps: 3
              scale_mode: "unit_rms_norm"
              extra_scale_factor: 0.2
              fp32_matmul_prec: "highest"
              split_qkv: false
              ns_eps: 1e-9
            }
          }
          sub_optimizers {
            name: "am"
            kind: "adaptive_muon"
            adaptive_muon {
              muon { num_ns_steps: 4 }
              moment2_method: "normuon"
              beta2: 0.9
              eps: 1e-6
            }
          }
          sub_optimizers {
            name: "s"
            kind: "soap"
            soap {
              beta2: 0.999
              precondition_frequency: 4
              precondition_warmup_steps: 2
              use_kl_shampoo: true
              bias_correction: false
              use_eigh_after_first: true
              max_update_rms: 1
              fp32_matmul_prec: "medium"
              qr_fp32_matmul_prec: "highest"
              nesterov: true
              power_iter_steps: 2
              use_adaptive_criteria: true
              adaptive_update_tolerance: 0.01
              correct_shampoo_beta_bias: true
              weight_decay_mode: WEIGHT_DECAY_MODE_L2
            }
          }
          sub_optimizers {
            name: "l"
            kind: "lion"
            lion { beta1: 0.95 beta2: 0.98 weight_decay_mode: WEIGHT_DECAY_MODE_PALM }
          }
          rules { name_glob: "*" sub_optimizer: "m" }
          mup_width_mult: 2
        }
      )pb")));
  const ChainConfig& chain = config.chain;
  ASSERT_EQ(chain.sub_optimizers.size(), 4u);
  const MuonConfig& m = chain.sub_optimizers[0].muon;
  EXPECT_EQ(m.lr, 0.02);
  EXPECT_EQ(m.momentum, 0.9);
  EXPECT_TRUE(m.nesterov);
  EXPECT_EQ(m.weight_decay_mode, WeightDecayMode::kIndependent);
  EXPECT_EQ(m.coefficient_type, "custom");
  EXPECT_EQ(m.custom_coefficients, (std::vector<double>{3, -3, 1}));
  EXPECT_EQ(m.num_ns_steps, 3);
  EXPECT_EQ(m.scale_mode, "unit_rms_norm");
  EXPECT_EQ(m.extra_scale_factor, 0.2);
  EXPECT_EQ(m.fp32_matmul_prec, "highest");
  EXPECT_FALSE(m.split_qkv);
  EXPECT_EQ(m.ns_eps, 1e-9);
  const AdaptiveMuonConfig& am = chain.sub_optimizers[1].adaptive_muon;
  EXPECT_EQ(am.muon.num_ns_steps, 4);
  EXPECT_EQ(am.muon.coefficient_type, "quintic");
  EXPECT_EQ(am.moment2_method, "normuon");
  EXPECT_EQ(am.beta2, 0.9);
  EXPECT_EQ(am.eps, 1e-6);
  const SoapConfig& soap = chain.sub_optimizers[2].soap;
  EXPECT_EQ(soap.beta1, 0.9);
  EXPECT_EQ(soap.beta2, 0.999);
  EXPECT_EQ(soap.precondition_frequency, 4);
  EXPECT_EQ(soap.warmup_steps, 2);
  EXPECT_TRUE(soap.use_kl_shampoo);
  EXPECT_FALSE(soap.correct_bias);
  EXPECT_EQ(soap.correct_shampoo_beta_bias, true);
  EXPECT_TRUE(soap.use_eigh);
  EXPECT_EQ(soap.max_update_rms, 1.0);
  EXPECT_EQ(soap.fp32_matmul_prec, "medium");
  EXPECT_EQ(soap.qr_fp32_matmul_prec, "highest");
  EXPECT_TRUE(soap.nesterov);
  EXPECT_EQ(soap.power_iter_steps, 2);
  EXPECT_TRUE(soap.use_adaptive_criteria);
  EXPECT_EQ(soap.adaptive_update_tolerance, 0.01);
  EXPECT_EQ(soap.weight_decay_mode, WeightDecayMode::kL2);
  const LionConfig& lion = chain.sub_optimizers[3].lion;
  EXPECT_EQ(lion.beta1, 0.95);
  EXPECT_EQ(lion.beta2, 0.98);
  EXPECT_EQ(lion.weight_decay_mode, WeightDecayMode::kPalm);
  EXPECT_EQ(chain.mup_width_mult, 2.0);
}

TEST(ConvertTest, RequestRulesComeBeforeThePresetsRouting) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SessionConfig config, SessionConfigFromProto(Spec(R"pb(
                                 parameters {
                                   name: "router.weight"
                                   shape: [ 4, 4 ]
                                 }
                                 num_trainers: 1
                                 gradient_mode: GRADIENT_MODE_SHARDED
                                 optimizer {
                                   preset: "muon"
                                   megatron_args { key: "muon_num_ns_steps" value: "3" }
                                   rules { name_glob: "router.*" sub_optimizer: "adam" }
                                 }
                               )pb")));
  ASSERT_EQ(config.chain.rules.size(), 3u);
  EXPECT_EQ(config.chain.rules[0].name_glob, "router.*");
  EXPECT_EQ(config.chain.rules[0].sub_optimizer, "adam");
  EXPECT_EQ(config.chain.sub_optimizers[0].muon.num_ns_steps, 3);
}

TEST(ConvertTest, StepHeader) {
  v1::StepHeader header;
  EXPECT_THAT(StepBeginFromProto(header).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "step must be >= 1"));
  header.set_step(4);
  header.set_trainer_id(1);
  auto* g = header.add_groups();
  g->set_group_id(2);
  g->set_lr(0.5);
  header.set_return_dtype(v1::DTYPE_BF16);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepBegin begin, StepBeginFromProto(header));
  EXPECT_EQ(begin.step, 4u);
  EXPECT_EQ(begin.trainer, 1);
  EXPECT_EQ(*begin.schedules.at(2).lr, 0.5);
  EXPECT_FALSE(begin.schedules.at(2).weight_decay.has_value());
  EXPECT_EQ(begin.return_dtype, DType::kBF16);
  header.set_return_dtype(v1::DTYPE_FP16);
  EXPECT_THAT(StepBeginFromProto(header).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "return_dtype 3 must be fp32 or bf16"));
}

}  // namespace
}  // namespace optstep
