#include "client/cli/format.h"

#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/session_info_helpers.h"

namespace optstep {
namespace cli {
namespace {

using ::optstep::testutil::MakeSessionInfo;
using ::testing::HasSubstr;

TEST(FormatTest, Health) {
  EXPECT_EQ(FormatHealth(true), "SERVING");
  EXPECT_EQ(FormatHealth(false), "NOT_SERVING");
}

TEST(FormatTest, Bytes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.0 KiB");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(4u << 20), "4.0 MiB");
  EXPECT_EQ(FormatBytes((1ull << 30) - 1), "1.0 GiB");  // not "1024.0 MiB"
  EXPECT_EQ(FormatBytes(5ull << 40), "5.0 TiB");
}

TEST(FormatTest, ShapesModesAndNumbers) {
  v1::ParameterSpec p;
  EXPECT_EQ(FormatShape(p), "[]");
  EXPECT_EQ(NumElements(p), 1u);
  p.add_shape(4096);
  p.add_shape(1024);
  EXPECT_EQ(FormatShape(p), "[4096, 1024]");
  EXPECT_EQ(NumElements(p), 4096u * 1024u);
  EXPECT_EQ(GradientModeName(v1::GRADIENT_MODE_SHARDED), "sharded");
  EXPECT_EQ(GradientModeName(v1::GRADIENT_MODE_REPLICATED), "replicated");
  EXPECT_EQ(GradientModeName(v1::GRADIENT_MODE_UNSPECIFIED), "unspecified");
  EXPECT_EQ(FormatNumber(0.001), "0.001");
  EXPECT_EQ(FormatNumber(3e-5), "3e-05");
  EXPECT_EQ(FormatNumber(1.0), "1");
}

TEST(FormatSessionListTest, OneRowPerSession) {
  v1::SessionSummary a;
  a.set_session_id("s-1");
  a.set_name("test-s-1");
  a.set_num_parameters(2);
  a.set_num_trainers(1);
  a.set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
  a.set_step(12);
  a.set_skipped_steps(2);
  a.set_param_bytes(80);
  a.set_state_bytes(160);
  v1::SessionSummary b;
  b.set_session_id("s-22");
  b.set_num_parameters(1);
  b.set_num_trainers(4);
  b.set_gradient_mode(v1::GRADIENT_MODE_REPLICATED);
  b.set_param_bytes(3u << 20);
  b.set_state_bytes(3u << 20);
  const std::vector<v1::SessionSummary> sessions = {a, b};
  EXPECT_EQ(FormatSessionList(sessions),
            "ID    NAME      PARAMS  TRAINERS  MODE        STEP  SKIPPED    BYTES\n"
            "s-1   test-s-1       2         1  sharded       12        2    240 B\n"
            "s-22  -              1         4  replicated     0        0  6.0 MiB\n");
}

TEST(FormatSessionListTest, NoSessions) { EXPECT_EQ(FormatSessionList({}), "no sessions\n"); }

TEST(FormatSessionDetailsTest, ShowsParametersGroupsAndLayout) {
  v1::SessionInfo s = MakeSessionInfo(
      "s-1", 2, {{"embed.weight", {100, 8}, 0}, {"layers.0.qkv.weight", {24, 8}, 1}});
  s.mutable_spec()->mutable_parameters(0)->set_embedding_or_output(true);
  v1::QkvSplit* qkv = s.mutable_spec()->mutable_parameters(1)->mutable_qkv();
  qkv->set_num_query_groups(2);
  qkv->set_q_per_group(2);
  qkv->set_head_dim(2);
  s.mutable_spec()->mutable_parameters(1)->set_model_chunk(1);
  s.mutable_spec()->mutable_optimizer()->set_preset("muon");
  s.mutable_spec()->mutable_optimizer()->set_clip_grad(0.5);
  // Group 0 (adamw) keeps param 0; param 1 moves to a muon group 1.
  s.mutable_groups(0)->mutable_param_ids()->RemoveLast();
  v1::GroupInfo* muon = s.add_groups();
  muon->set_id(1);
  muon->set_sub_optimizer("muon");
  muon->set_lr(3e-4);
  muon->set_weight_decay(0.1);
  muon->set_wd_mult(1);
  muon->add_param_ids(1);
  s.set_step(5);
  s.set_skipped_steps(1);
  s.set_param_bytes(4 * 992);
  s.set_state_bytes(8 * 992);

  const std::string text = FormatSessionDetails(s);
  EXPECT_THAT(text, HasSubstr("session        s-1\n"));
  EXPECT_THAT(text, HasSubstr("name           test-s-1\n"));
  EXPECT_THAT(text, HasSubstr("trainers       1 (sharded gradients)\n"));
  EXPECT_THAT(text, HasSubstr("step           5 (1 skipped)\n"));
  EXPECT_THAT(text, HasSubstr("step deadline  server default\n"));
  EXPECT_THAT(text, HasSubstr("memory         params 3.9 KiB, state 7.8 KiB\n"));
  EXPECT_THAT(text, HasSubstr("optimizer      preset muon; clip_grad 0.5\n"));
  EXPECT_THAT(text, HasSubstr("layout         world size 2; rank 0: 1 params (3.1 KiB), "
                              "rank 1: 1 params (768 B)\n"));
  EXPECT_THAT(text,
              HasSubstr("parameters (2)\n"
                        "ID  NAME                 SHAPE     ELEMENTS  CHUNK  OWNER  GROUP  FLAGS\n"
                        " 0  embed.weight         [100, 8]       800      0      0      0  "
                        "embedding/output\n"
                        " 1  layers.0.qkv.weight  [24, 8]        192      1      1      1  "
                        "qkv(groups=2, q_per_group=2, head_dim=2)\n"));
  EXPECT_THAT(text, HasSubstr("groups (2)\n"
                              "ID  SUB-OPTIMIZER      LR  WEIGHT_DECAY  WD_MULT  PARAMS\n"
                              " 0  adamw           0.001          0.01        1       1\n"
                              " 1  muon           0.0003           0.1        1       1\n"));
}

TEST(FormatSessionDetailsTest, ChainOptimizer) {
  v1::SessionInfo s = MakeSessionInfo("s", 1, {{"w", {2}, 0}});
  v1::OptimizerConfig* opt = s.mutable_spec()->mutable_optimizer();
  v1::SubOptimizer* adam = opt->add_sub_optimizers();
  adam->set_name("adam");
  adam->set_kind("adamw");
  v1::SubOptimizer* muon = opt->add_sub_optimizers();
  muon->set_name("matrices");
  muon->set_kind("muon");
  opt->add_rules()->set_sub_optimizer("matrices");
  s.mutable_spec()->set_step_deadline_ms(30000);
  const std::string text = FormatSessionDetails(s);
  EXPECT_THAT(text, HasSubstr("optimizer      chain adam (adamw), matrices (muon), 1 rule(s); "
                              "clip_grad default\n"));
  EXPECT_THAT(text, HasSubstr("step deadline  30000 ms\n"));
}

TEST(FormatErrorTest, NamesCommandTargetAndCode) {
  EXPECT_EQ(FormatError("health", "localhost:1", absl::UnavailableError("connection refused")),
            "optstep health: localhost:1: UNAVAILABLE: connection refused\n");
}

}  // namespace
}  // namespace cli
}  // namespace optstep
