// Validation of requests at the RPC boundary: each malformed request names the field, the
// parameter and the values.

#include "server/rpc/convert.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "google/protobuf/text_format.h"
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
  parameters { name: "fc1.weight" shape: [ 8, 4 ] }
  parameters { name: "fc1.bias" shape: [ 8 ] }
  num_trainers: 2
  gradient_mode: GRADIENT_MODE_REPLICATED
  step_deadline_ms: 1500
  optimizer {
    sub_optimizers { name: "adam" kind: "adamw" adamw { lr: 0.01 beta2: 0.95 decoupled: false } }
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
       "GRADIENT_MODE_SHARDED optimizer { preset: 'soap' }",
       absl::StatusCode::kUnimplemented, "preset 'soap'"},
  };
  for (const Row& row : rows) {
    EXPECT_THAT(SessionConfigFromProto(Spec(row.text)).status(), StatusIs(row.code, row.message))
        << row.text;
  }
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

TEST(ConvertTest, DTypes) {
  EXPECT_EQ(*DTypeFromProto(v1::DTYPE_FP16, "x"), DType::kF16);
  EXPECT_THAT(DTypeFromProto(v1::DTYPE_UNSPECIFIED, "chunk of param 3").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "chunk of param 3: dtype 0"));
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    EXPECT_EQ(*DTypeFromProto(DTypeToProto(d), "x"), d);
  }
}

}  // namespace
}  // namespace optstep
