// Megatron-parity presets (spec Appendix A) and their Megatron-style arguments.

#include "server/optim/presets.h"

#include <algorithm>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/optim/registry.h"
#include "server/optim/routing.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;
using ::testing::ElementsAre;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

std::vector<ParamInfo> GptLike() {
  std::vector<ParamInfo> params = {
      {"embedding.word_embeddings.weight", {64, 16}},
      {"layers.0.input_layernorm.weight", {16}},
      {"layers.0.attention.linear_qkv.weight", {48, 16}},
      {"layers.0.attention.linear_qkv.bias", {48}},
      {"layers.0.mlp.linear_fc1.weight", {64, 16}},
      {"output_layer.weight", {64, 16}},
  };
  params[0].embedding_or_output = true;
  params[5].embedding_or_output = true;
  return params;
}

// Parameter ids routed to each sub-optimizer, by name.
std::map<std::string, std::vector<int>> Routed(const ChainConfig& chain) {
  absl::StatusOr<std::vector<ParamGroup>> groups = RouteParameters(chain, GptLike());
  EXPECT_TRUE(groups.ok()) << groups.status();
  std::map<std::string, std::vector<int>> out;
  for (const ParamGroup& g : *groups) {
    auto& ids = out[chain.sub_optimizers[g.sub_optimizer].name];
    ids.insert(ids.end(), g.param_ids.begin(), g.param_ids.end());
    std::sort(ids.begin(), ids.end());
  }
  return out;
}

TEST(PresetsTest, AppendixAValues) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(ChainConfig muon, ExpandPreset("muon", {}));
  ASSERT_EQ(muon.sub_optimizers.size(), 2u);
  const MuonConfig& m = muon.sub_optimizers[0].muon;
  EXPECT_EQ(muon.sub_optimizers[0].kind, "muon");
  EXPECT_EQ(m.momentum, 0.9);
  EXPECT_FALSE(m.nesterov);
  EXPECT_EQ(m.weight_decay, 0.01);
  EXPECT_EQ(m.weight_decay_mode, WeightDecayMode::kDecoupled);
  EXPECT_EQ(m.coefficient_type, "quintic");
  EXPECT_EQ(m.num_ns_steps, 5);
  EXPECT_EQ(m.scale_mode, "spectral");
  EXPECT_EQ(m.extra_scale_factor, 1.0);
  EXPECT_EQ(m.fp32_matmul_prec, "medium");
  EXPECT_TRUE(m.split_qkv);
  const AdamWConfig& adam = muon.sub_optimizers[1].adamw;
  EXPECT_EQ(muon.sub_optimizers[1].kind, "adamw");
  EXPECT_EQ(adam.beta1, 0.9);
  EXPECT_EQ(adam.beta2, 0.999);
  EXPECT_EQ(adam.eps, 1e-8);
  EXPECT_EQ(adam.weight_decay, 0.01);
  EXPECT_EQ(muon.clip_grad, 1.0);

  OPTSTEP_ASSERT_OK_AND_ASSIGN(ChainConfig dist, ExpandPreset("dist_muon", {}));
  EXPECT_EQ(dist.sub_optimizers[0].kind, "muon");

  OPTSTEP_ASSERT_OK_AND_ASSIGN(ChainConfig am, ExpandPreset("adaptive_muon", {}));
  EXPECT_EQ(am.sub_optimizers[0].adaptive_muon.moment2_method, "adamuon");
  EXPECT_EQ(am.sub_optimizers[0].adaptive_muon.beta2, 0.95);
  EXPECT_EQ(am.sub_optimizers[0].adaptive_muon.eps, 1e-8);
  EXPECT_EQ(am.sub_optimizers[0].adaptive_muon.muon.momentum, 0.9);

  OPTSTEP_ASSERT_OK_AND_ASSIGN(ChainConfig soap, ExpandPreset("soap", {}));
  const SoapConfig& s = soap.sub_optimizers[0].soap;
  EXPECT_EQ(s.beta1, 0.9);
  EXPECT_EQ(s.beta2, 0.999);
  EXPECT_EQ(s.shampoo_beta, 0.95);
  EXPECT_EQ(s.eps, 1e-8);
  EXPECT_EQ(s.weight_decay, 0.01);
  EXPECT_EQ(s.precondition_frequency, 1);
  EXPECT_EQ(s.warmup_steps, 0);
  EXPECT_TRUE(s.use_kl_shampoo);
  EXPECT_EQ(s.fp32_matmul_prec, "high");
  EXPECT_EQ(s.qr_fp32_matmul_prec, "high");
  EXPECT_FALSE(s.use_eigh);
  EXPECT_EQ(s.max_update_rms, 0.0);

  OPTSTEP_ASSERT_OK_AND_ASSIGN(ChainConfig lion, ExpandPreset("lion", {}));
  EXPECT_EQ(lion.sub_optimizers[0].lion.beta1, 0.9);
  EXPECT_EQ(lion.sub_optimizers[0].lion.beta2, 0.999);
  EXPECT_EQ(lion.sub_optimizers[0].lion.weight_decay, 0.01);
}

TEST(PresetsTest, EmergingPresetsRouteByTheReferenceTable) {
  for (const char* preset : {"muon", "adaptive_muon", "soap", "lion"}) {
    SCOPED_TRACE(preset);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(ChainConfig chain, ExpandPreset(preset, {}));
    auto routed = Routed(chain);
    EXPECT_THAT(routed[chain.sub_optimizers[0].name], ElementsAre(2, 4));
    EXPECT_THAT(routed["adam"], ElementsAre(0, 1, 3, 5));
  }
  // A scalar optimizer other than Adam takes effect (spec §4).
  OPTSTEP_ASSERT_OK_AND_ASSIGN(ChainConfig chain,
                               ExpandPreset("muon", {{"scalar_optimizer", "lion"}}));
  auto routed = Routed(chain);
  EXPECT_THAT(routed["scalar_lion"], ElementsAre(0, 1, 3, 5));
  EXPECT_THAT(ExpandPreset("lion", {{"scalar_optimizer", "lion"}}).status(),
              StatusIs(kInvalid, "scalar_optimizer'] = 'lion' is not adam"));
}

TEST(PresetsTest, MegatronArgumentsOverrideThePreset) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(ChainConfig muon,
                               ExpandPreset("muon", {{"lr", "0.02"},
                                                     {"weight_decay", "0.1"},
                                                     {"muon_momentum", "0.95"},
                                                     {"muon_nesterov", "true"},
                                                     {"muon_coefficient_type", "polar_express"},
                                                     {"muon_num_ns_steps", "8"},
                                                     {"muon_scale_mode", "unit_rms_norm"},
                                                     {"muon_extra_scale_factor", "0.2"},
                                                     {"muon_fp32_matmul_prec", "highest"},
                                                     {"muon_split_qkv", "false"},
                                                     {"muon_tp_mode", "duplicated"},
                                                     {"adam_beta2", "0.95"},
                                                     {"clip_grad", "0.5"}}));
  const MuonConfig& m = muon.sub_optimizers[0].muon;
  EXPECT_EQ(m.lr, 0.02);
  EXPECT_EQ(m.weight_decay, 0.1);
  EXPECT_EQ(m.momentum, 0.95);
  EXPECT_TRUE(m.nesterov);
  EXPECT_EQ(m.coefficient_type, "polar_express");
  EXPECT_EQ(m.num_ns_steps, 8);
  EXPECT_EQ(m.scale_mode, "unit_rms_norm");
  EXPECT_EQ(m.extra_scale_factor, 0.2);
  EXPECT_EQ(m.fp32_matmul_prec, "highest");
  EXPECT_FALSE(m.split_qkv);
  EXPECT_EQ(muon.sub_optimizers[1].adamw.lr, 0.02);
  EXPECT_EQ(muon.sub_optimizers[1].adamw.beta2, 0.95);
  EXPECT_EQ(muon.clip_grad, 0.5);

  OPTSTEP_ASSERT_OK_AND_ASSIGN(ChainConfig soap,
                               ExpandPreset("soap", {{"adam_beta2", "0.95"},
                                                     {"soap_shampoo_beta", "0.9"},
                                                     {"soap_precondition_frequency", "10"},
                                                     {"soap_warmup_steps", "20"},
                                                     {"soap_use_kl_shampoo", "0"},
                                                     {"soap_correct_shampoo_beta_bias", "false"},
                                                     {"soap_max_update_rms", "1.5"},
                                                     {"soap_power_iter_steps", "2"}}));
  const SoapConfig& s = soap.sub_optimizers[0].soap;
  EXPECT_EQ(s.beta2, 0.95);  // Megatron feeds SOAP the Adam betas
  EXPECT_EQ(s.shampoo_beta, 0.9);
  EXPECT_EQ(s.precondition_frequency, 10);
  EXPECT_EQ(s.warmup_steps, 20);
  EXPECT_FALSE(s.use_kl_shampoo);
  EXPECT_EQ(s.correct_shampoo_beta_bias, false);
  EXPECT_EQ(s.max_update_rms, 1.5);
  EXPECT_EQ(s.power_iter_steps, 2);

  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      ChainConfig lion, ExpandPreset("lion", {{"lion_beta1", "0.95"}, {"adam_beta2", "0.98"}}));
  EXPECT_EQ(lion.sub_optimizers[0].lion.beta1, 0.95);
  EXPECT_EQ(lion.sub_optimizers[0].lion.beta2, 0.98);

  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      ChainConfig am, ExpandPreset("adaptive_muon", {{"adaptive_muon_moment2_method", "normuon"},
                                                     {"adaptive_muon_beta2", "0.9"},
                                                     {"adaptive_muon_eps", "1e-6"},
                                                     {"muon_momentum", "0.8"}}));
  EXPECT_EQ(am.sub_optimizers[0].adaptive_muon.moment2_method, "normuon");
  EXPECT_EQ(am.sub_optimizers[0].adaptive_muon.beta2, 0.9);
  EXPECT_EQ(am.sub_optimizers[0].adaptive_muon.eps, 1e-6);
  EXPECT_EQ(am.sub_optimizers[0].adaptive_muon.muon.momentum, 0.8);
}

TEST(PresetsTest, QkLayerNormsKeepTheirWeightDecayOnRequest) {
  std::vector<ParamInfo> params = {{"layers.0.self_attention.q_layernorm.weight", {16}},
                                   {"layers.0.self_attention.k_layernorm.weight", {16}},
                                   {"layers.0.input_layernorm.weight", {16}}};
  for (const char* preset : {"adam", "muon"}) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(ChainConfig chain,
                                 ExpandPreset(preset, {{"apply_wd_to_qk_layernorm", "true"}}));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(auto groups, RouteParameters(chain, params));
    std::vector<double> wd_mult(3);
    for (const ParamGroup& g : groups) {
      for (int p : g.param_ids) wd_mult[p] = g.wd_mult;
    }
    EXPECT_THAT(wd_mult, ElementsAre(1.0, 1.0, 0.0)) << preset;
  }
}

TEST(PresetsTest, BadArgumentsNameTheKeyAndValue) {
  EXPECT_THAT(ExpandPreset("muon", {{"soap_eps", "1e-6"}}).status(),
              StatusIs(kInvalid, "megatron_args key 'soap_eps' does not apply to preset 'muon'"));
  EXPECT_THAT(ExpandPreset("soap", {{"muon_momentum", "0.9"}}).status(),
              StatusIs(kInvalid, "'muon_momentum' does not apply to preset 'soap'"));
  EXPECT_THAT(ExpandPreset("muon", {{"muon_num_ns_steps", "five"}}).status(),
              StatusIs(kInvalid, "megatron_args['muon_num_ns_steps'] = 'five' is not an integer"));
  EXPECT_THAT(ExpandPreset("muon", {{"muon_nesterov", "maybe"}}).status(),
              StatusIs(kInvalid, "'maybe' is not true or false"));
  EXPECT_THAT(ExpandPreset("muon", {{"muon_tp_mode", "rowwise"}}).status(),
              StatusIs(kInvalid, "muon_tp_mode'] = 'rowwise'"));
  EXPECT_THAT(ExpandPreset("adam", {{"lion_beta1", "0.9"}}).status(),
              StatusIs(kInvalid, "'lion_beta1' does not apply to preset 'adam'"));
  // Values are checked when the sub-optimizer is created, naming it.
  auto create = [](const ChainConfig& chain) {
    return CreateOptimizer("sub_optimizer 'x'", chain.sub_optimizers[0], GroupOverrides{}).status();
  };
  OPTSTEP_ASSERT_OK_AND_ASSIGN(ChainConfig chain,
                               ExpandPreset("muon", {{"muon_num_ns_steps", "0"}}));
  EXPECT_THAT(create(chain),
              StatusIs(kInvalid, "sub_optimizer 'x': num_ns_steps = 0 must be >= 1"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(chain, ExpandPreset("muon", {{"muon_coefficient_type", "cans"}}));
  EXPECT_THAT(create(chain), StatusIs(kInvalid, "coefficient_type 'cans'"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(chain, ExpandPreset("soap", {{"soap_precondition_frequency", "0"}}));
  EXPECT_THAT(create(chain), StatusIs(kInvalid, "precondition_frequency = 0 must be >= 1"));
}

}  // namespace
}  // namespace optstep
