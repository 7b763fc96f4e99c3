#include "server/optim/registry.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/optim/presets.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

TEST(RegistryTest, KindsAndAliases) {
  EXPECT_EQ(*CanonicalOptimizerKind("x", "adam"), "adamw");
  EXPECT_EQ(*CanonicalOptimizerKind("x", "adamw"), "adamw");
  EXPECT_EQ(*CanonicalOptimizerKind("x", "sgd"), "sgd");
  EXPECT_EQ(*CanonicalOptimizerKind("x", "dist_muon"), "muon");
  EXPECT_THAT(CanonicalOptimizerKind("x", "adagrad").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown optimizer kind 'adagrad'"));
  EXPECT_THAT(ImplementedOptimizerKinds(),
              ::testing::ElementsAre("adamw", "adaptive_muon", "lion", "muon", "sgd", "soap"));
}

TEST(RegistryTest, InvalidHyperparametersNameTheOwnerAndValue) {
  SubOptimizerConfig adam;
  adam.name = "adam";
  adam.kind = "adamw";
  GroupOverrides none;
  EXPECT_THAT(CreateOptimizer("g", adam, none).status(), IsOk());
  adam.adamw.beta1 = 1.0;
  EXPECT_THAT(CreateOptimizer("g", adam, none).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "g: beta1 = 1 must be in [0, 1)"));
  adam.adamw.beta1 = 0.9;
  adam.adamw.eps = -1;
  EXPECT_THAT(CreateOptimizer("g", adam, none).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "eps = -1"));
  adam.adamw.eps = 1e-8;
  adam.adamw.lr = -0.1;
  EXPECT_THAT(CreateOptimizer("g", adam, none).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "lr = -0.1"));

  SubOptimizerConfig sgd;
  sgd.name = "sgd";
  sgd.kind = "sgd";
  sgd.sgd.nesterov = true;
  EXPECT_THAT(CreateOptimizer("g", sgd, none).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "nesterov requires momentum > 0"));
  sgd.sgd.momentum = 0.9;
  EXPECT_THAT(CreateOptimizer("g", sgd, none).status(), IsOk());
  GroupOverrides beta;
  beta.beta1 = 0.5;
  EXPECT_THAT(
      CreateOptimizer("g", sgd, beta).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "override beta1 = 0.5 does not apply to sgd"));
}

TEST(RegistryTest, OverridesChangeTheGroupsDefaults) {
  SubOptimizerConfig adam;
  adam.name = "adam";
  adam.kind = "adamw";
  GroupOverrides o;
  o.lr = 0.25;
  o.weight_decay = 0.125;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto opt, CreateOptimizer("g", adam, o));
  EXPECT_EQ(opt->kind(), "adamw");
  EXPECT_EQ(opt->default_lr(), 0.25);
  EXPECT_EQ(opt->default_weight_decay(), 0.125);
}

TEST(RegistryTest, EveryKindWithItsOverrides) {
  GroupOverrides o;
  o.lr = 0.5;
  o.beta2 = 0.9;
  for (const char* kind : {"adamw", "lion", "soap", "adaptive_muon"}) {
    SubOptimizerConfig sub;
    sub.name = "s";
    sub.kind = kind;
    OPTSTEP_ASSERT_OK_AND_ASSIGN(auto opt, CreateOptimizer("g", sub, o));
    EXPECT_EQ(opt->default_lr(), 0.5) << kind;
  }
  SubOptimizerConfig muon;
  muon.name = "m";
  muon.kind = "dist_muon";
  EXPECT_THAT(
      CreateOptimizer("g", muon, o).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "override beta2 = 0.9 does not apply to muon"));
  GroupOverrides momentum;
  momentum.momentum = 0.8;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto m, CreateOptimizer("g", muon, momentum));
  EXPECT_EQ(m->kind(), "muon");
  SubOptimizerConfig lion;
  lion.name = "l";
  lion.kind = "lion";
  EXPECT_THAT(
      CreateOptimizer("g", lion, momentum).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "momentum = 0.8 does not apply to lion"));
  // MuP multipliers: lr_mult wraps the optimizer, eps_mult only where there is an eps.
  GroupOverrides mup;
  mup.lr_mult = 0.25;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto scaled, CreateOptimizer("g", lion, mup));
  EXPECT_EQ(scaled->kind(), "lion");
  EXPECT_EQ(scaled->default_lr(), 1e-4);
  mup.eps_mult = 0.25;
  EXPECT_THAT(
      CreateOptimizer("g", lion, mup).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "eps_mult = 0.25 does not apply to lion"));
  mup.eps_mult.reset();
  mup.lr_mult = -1.0;
  EXPECT_THAT(CreateOptimizer("g", lion, mup).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "lr_mult = -1"));
}

TEST(PresetsTest, MegatronAdamAndSgdPresets) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(ChainConfig adam, ExpandPreset("adam", {{"lr", "3e-4"}}));
  ASSERT_EQ(adam.sub_optimizers.size(), 1u);
  EXPECT_EQ(adam.sub_optimizers[0].kind, "adamw");
  EXPECT_EQ(adam.sub_optimizers[0].adamw.lr, 3e-4);
  EXPECT_EQ(adam.sub_optimizers[0].adamw.weight_decay, 0.01);
  EXPECT_EQ(adam.sub_optimizers[0].adamw.beta2, 0.999);
  EXPECT_EQ(adam.clip_grad, 1.0);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(ChainConfig sgd, ExpandPreset("sgd", {{"clip_grad", "0"}}));
  EXPECT_EQ(sgd.sub_optimizers[0].sgd.momentum, 0.9);
  EXPECT_EQ(sgd.sub_optimizers[0].sgd.weight_decay, 0.01);
  EXPECT_EQ(sgd.clip_grad, 0.0);
}

TEST(PresetsTest, UnknownPresetsAndArgumentsAreRefused) {
  EXPECT_THAT(ExpandPreset("adamax", {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown preset 'adamax'"));
  EXPECT_THAT(ExpandPreset("adam", {{"lr", "fast"}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "megatron_args['lr'] = 'fast'"));
  EXPECT_THAT(ExpandPreset("adam", {{"sgd_momentum", "0.5"}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "'sgd_momentum' does not apply"));
  EXPECT_THAT(ExpandPreset("sgd", {{"warmup", "5"}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "'warmup'"));
}

}  // namespace
}  // namespace optstep
