#include "server/optim/routing.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;
using ::testing::ElementsAre;

SubOptimizerConfig Sub(const std::string& name, const std::string& kind) {
  SubOptimizerConfig sub;
  sub.name = name;
  sub.kind = kind;
  return sub;
}

std::vector<ParamInfo> GptLikeParams() {
  std::vector<ParamInfo> params = {
      {"embedding.word_embeddings.weight", {100, 16}},
      {"layers.0.input_layernorm.weight", {16}},
      {"layers.0.attention.qkv.weight", {48, 16}},
      {"layers.0.attention.qkv.bias", {48}},
      {"layers.0.mlp.fc1.weight", {64, 16}},
      {"layers.0.mlp.router.weight", {4, 16}},
      {"output_layer.weight", {100, 16}},
  };
  params[0].embedding_or_output = true;
  params[6].embedding_or_output = true;
  return params;
}

TEST(RoutingTest, SingleSubOptimizerTakesEverythingWithReferenceWdMult) {
  ChainConfig chain;
  chain.sub_optimizers = {Sub("adam", "adamw")};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto groups, RouteParameters(chain, GptLikeParams()));
  ASSERT_EQ(groups.size(), 2u);
  // Groups: (adam, wd_mult 0) and (adam, wd_mult 1), ordered by key.
  EXPECT_EQ(groups[0].wd_mult, 0.0);
  EXPECT_THAT(groups[0].param_ids, ElementsAre(1, 3));
  EXPECT_EQ(groups[1].wd_mult, 1.0);
  EXPECT_THAT(groups[1].param_ids, ElementsAre(0, 2, 4, 5, 6));
  EXPECT_EQ(groups[0].id, 0);
  EXPECT_EQ(groups[1].id, 1);
}

TEST(RoutingTest, DefaultChainRoutingFollowsTheReferenceTable) {
  ChainConfig chain;
  chain.sub_optimizers = {Sub("matrix", "sgd"), Sub("adam", "adam")};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto groups, RouteParameters(chain, GptLikeParams()));
  std::vector<int> matrix, adam;
  for (const ParamGroup& g : groups) {
    for (int p : g.param_ids) (g.sub_optimizer == 0 ? matrix : adam).push_back(p);
  }
  std::sort(adam.begin(), adam.end());
  // 2-D unflagged (qkv, fc1, router) -> the matrix optimizer; embedding, output, 1-D -> Adam.
  EXPECT_THAT(matrix, ElementsAre(2, 4, 5));
  EXPECT_THAT(adam, ElementsAre(0, 1, 3, 6));
}

TEST(RoutingTest, RulesMatchInOrderAndCarryOverrides) {
  ChainConfig chain;
  chain.sub_optimizers = {Sub("adam", "adamw"), Sub("sgd", "sgd")};
  RoutingRule norms;
  norms.name_glob = "*layernorm*";
  norms.sub_optimizer = "sgd";
  RoutingRule mlp;
  mlp.name_glob = "layers.*.mlp.*";
  mlp.ndim = 2;
  mlp.sub_optimizer = "adam";
  mlp.overrides.lr = 0.5;
  mlp.overrides.wd_mult = 2.0;
  RoutingRule rest;
  rest.sub_optimizer = "adam";
  chain.rules = {norms, mlp, rest};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto groups, RouteParameters(chain, GptLikeParams()));
  ASSERT_EQ(groups.size(), 4u);
  // adam without overrides (wd_mult 0, then 1), adam with overrides, then sgd.
  EXPECT_THAT(groups[0].param_ids, ElementsAre(3));
  EXPECT_THAT(groups[1].param_ids, ElementsAre(0, 2, 6));
  EXPECT_THAT(groups[2].param_ids, ElementsAre(4, 5));
  EXPECT_EQ(*groups[2].overrides.lr, 0.5);
  EXPECT_EQ(groups[2].wd_mult, 2.0);
  EXPECT_FALSE(groups[2].overrides.wd_mult.has_value());
  EXPECT_EQ(groups[3].sub_optimizer, 1);
  EXPECT_THAT(groups[3].param_ids, ElementsAre(1));
}

TEST(RoutingTest, ExpertParametersFormTheirOwnGroup) {
  ChainConfig chain;
  chain.sub_optimizers = {Sub("adam", "adamw")};
  std::vector<ParamInfo> params = {{"a.weight", {4, 4}}, {"e.weight", {4, 4}}};
  params[1].expert = true;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto groups, RouteParameters(chain, params));
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_FALSE(groups[0].expert);
  EXPECT_TRUE(groups[1].expert);
}

TEST(RoutingTest, InvalidChainsAreRefusedNamingTheCulprit) {
  ChainConfig chain;
  EXPECT_THAT(RouteParameters(chain, GptLikeParams()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "no sub-optimizer"));
  chain.sub_optimizers = {Sub("a", "adamw"), Sub("a", "sgd")};
  EXPECT_THAT(RouteParameters(chain, GptLikeParams()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "duplicate sub_optimizer name 'a'"));
  chain.sub_optimizers = {Sub("a", "rmsprop")};
  EXPECT_THAT(RouteParameters(chain, GptLikeParams()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown optimizer kind 'rmsprop'"));
  chain.sub_optimizers = {Sub("a", "adamw")};
  RoutingRule rule;
  rule.sub_optimizer = "b";
  chain.rules = {rule};
  EXPECT_THAT(RouteParameters(chain, GptLikeParams()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown sub_optimizer 'b'"));
  chain.rules.clear();
  chain.sub_optimizers = {Sub("a", "sgd"), Sub("b", "sgd")};
  EXPECT_THAT(RouteParameters(chain, GptLikeParams()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "param 'embedding.word_embeddings.weight': no routing rule matches"));
}

TEST(RoutingTest, InvalidSubOptimizersAreRefusedEvenWhenUnused) {
  ChainConfig chain;
  chain.sub_optimizers = {Sub("adam", "adamw"), Sub("soap", "soap")};
  chain.sub_optimizers[1].soap.precondition_frequency = 0;
  RoutingRule all;
  all.sub_optimizer = "adam";
  chain.rules = {all};
  EXPECT_THAT(RouteParameters(chain, GptLikeParams()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "sub_optimizer 'soap': precondition_frequency = 0 must be >= 1"));
  chain.sub_optimizers[1].soap.precondition_frequency = 1;
  chain.mup_width_mult = 0.0;
  EXPECT_THAT(RouteParameters(chain, GptLikeParams()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "mup_width_mult = 0"));
}

TEST(RoutingTest, MupWidthMultiplierRescalesByOptimizerKind) {
  ChainConfig chain;
  chain.sub_optimizers = {Sub("lion", "lion"), Sub("adam", "adamw")};
  chain.mup_width_mult = 4.0;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto groups, RouteParameters(chain, GptLikeParams()));
  for (const ParamGroup& g : groups) {
    const bool matrix_group = g.sub_optimizer == 0;
    // Lion gets the hidden matrices (lr/w); Adam only vector-like parameters (unchanged).
    if (matrix_group) {
      EXPECT_EQ(*g.overrides.lr_mult, 0.25);
      EXPECT_FALSE(g.overrides.eps_mult.has_value());
    } else {
      EXPECT_TRUE(g.overrides.empty());
    }
  }
  // Adam alone: hidden matrices get lr/w and eps/w; embedding/output and 1-D keep theirs.
  chain.sub_optimizers = {Sub("adam", "adamw")};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(groups, RouteParameters(chain, GptLikeParams()));
  std::vector<int> scaled;
  for (const ParamGroup& g : groups) {
    if (g.overrides.lr_mult) {
      EXPECT_EQ(*g.overrides.lr_mult, 0.25);
      EXPECT_EQ(*g.overrides.eps_mult, 0.25);
      scaled.insert(scaled.end(), g.param_ids.begin(), g.param_ids.end());
    }
  }
  EXPECT_THAT(scaled, ElementsAre(2, 4, 5));
  // SGD: vector-like parameters get lr·w. Muon: nothing changes.
  chain.sub_optimizers = {Sub("sgd", "sgd")};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(groups, RouteParameters(chain, GptLikeParams()));
  scaled.clear();
  for (const ParamGroup& g : groups) {
    if (g.overrides.lr_mult) {
      EXPECT_EQ(*g.overrides.lr_mult, 4.0);
      scaled.insert(scaled.end(), g.param_ids.begin(), g.param_ids.end());
    }
  }
  std::sort(scaled.begin(), scaled.end());
  EXPECT_THAT(scaled, ElementsAre(0, 1, 3, 6));
  chain.sub_optimizers = {Sub("muon", "muon"), Sub("adam", "adamw")};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(groups, RouteParameters(chain, GptLikeParams()));
  for (const ParamGroup& g : groups) EXPECT_TRUE(g.overrides.empty());
}

TEST(RoutingTest, DefaultWdMult) {
  EXPECT_EQ(DefaultWdMult({"x.bias", {4, 4}}), 0.0);
  EXPECT_EQ(DefaultWdMult({"x.weight", {4}}), 0.0);
  EXPECT_EQ(DefaultWdMult({"scale", {}}), 0.0);
  EXPECT_EQ(DefaultWdMult({"x.weight", {4, 4}}), 1.0);
  EXPECT_EQ(DefaultWdMult({"x.weight", {2, 4, 4}}), 1.0);
}

}  // namespace
}  // namespace optstep
