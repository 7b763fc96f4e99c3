// Session::AddGradient with a chunk in pieces, as the Step stream hands over received network
// slices: every cut, even inside an element, gives the gradient of the contiguous bytes.

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

constexpr int kElements = 5;

// One SGD step (lr 1, from zero parameters) with the gradient `bytes` of `dtype` cut into
// pieces of `piece_bytes`; answers the parameters, -gradient in fp32.
// A session of one parameter "w" (SGD, lr 1, no clipping) and trainer 0's part of step 1.
std::pair<std::shared_ptr<Session>, StepHandle> BeginSgdStep(Engine& engine) {
  SessionConfig config;
  config.params = {ParamInfo{"w", {kElements}}};
  SubOptimizerConfig sgd;
  sgd.name = "sgd";
  sgd.kind = "sgd";
  sgd.sgd.lr = 1.0;
  config.chain.sub_optimizers = {sgd};
  config.chain.clip_grad = 0.0;
  auto created = engine.CreateSession(config);
  EXPECT_THAT(created.status(), IsOk());
  StepBegin begin;
  begin.step = 1;
  auto c = created->session->Begin(begin);
  EXPECT_THAT(c.status(), IsOk());
  return {created->session, *c};
}

std::vector<float> StepWithPieces(Engine& engine, DType dtype, const std::string& bytes,
                                  size_t piece_bytes) {
  auto [owner, c] = BeginSgdStep(engine);
  Session& session = *owner;
  std::vector<absl::string_view> pieces;
  for (size_t at = 0; at < bytes.size(); at += piece_bytes) {
    pieces.push_back(absl::string_view(bytes).substr(at, piece_bytes));
  }
  EXPECT_THAT(session.AddGradient(c, 0, 0, dtype, pieces), IsOk());
  absl::Notification done;
  std::vector<float> params(kElements);
  EXPECT_THAT(session.Commit(c, kElements,
                             [&](absl::StatusOr<StepOutcome> outcome) {
                               EXPECT_THAT(outcome.status(), IsOk());
                               std::memcpy(params.data(), outcome->params->values[0].data(),
                                           kElements * 4);
                               done.Notify();
                             }),
              IsOk());
  done.WaitForNotification();
  return params;
}

class SessionPiecesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto engine = Engine::Create(EngineOptions{});
    ASSERT_THAT(engine.status(), IsOk());
    engine_ = *std::move(engine);
  }
  std::unique_ptr<Engine> engine_;
};

TEST_F(SessionPiecesTest, Fp32CutAnywhere) {
  const float gradient[kElements] = {1.5f, -2.25f, 3e-3f, 1e20f, -0.0f};
  const std::string bytes(reinterpret_cast<const char*>(gradient), sizeof(gradient));
  for (size_t piece_bytes = 1; piece_bytes <= bytes.size(); ++piece_bytes) {
    SCOPED_TRACE(piece_bytes);
    std::vector<float> params = StepWithPieces(*engine_, DType::kF32, bytes, piece_bytes);
    for (int i = 0; i < kElements; ++i) EXPECT_EQ(params[i], -gradient[i]);
  }
}

TEST_F(SessionPiecesTest, Bf16CutInsideElements) {
  // bf16 is the high half of an fp32: 1.0, -2.0, 0.5, 3.0, -0.25.
  const uint16_t gradient[kElements] = {0x3f80, 0xc000, 0x3f00, 0x4040, 0xbe80};
  const float expected[kElements] = {-1.0f, 2.0f, -0.5f, -3.0f, 0.25f};
  const std::string bytes(reinterpret_cast<const char*>(gradient), sizeof(gradient));
  for (size_t piece_bytes : {1, 3, 7}) {
    SCOPED_TRACE(piece_bytes);
    std::vector<float> params = StepWithPieces(*engine_, DType::kBF16, bytes, piece_bytes);
    for (int i = 0; i < kElements; ++i) EXPECT_EQ(params[i], expected[i]);
  }
}

TEST_F(SessionPiecesTest, PiecesThatAreNotWholeElementsAreRefused) {
  auto [session, c] = BeginSgdStep(*engine_);
  const std::vector<absl::string_view> pieces = {"abc", "de"};
  EXPECT_THAT(session->AddGradient(c, 0, 0, DType::kF32, pieces),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "param 'w': 5 bytes is not a multiple of the fp32 element size 4"));
}

}  // namespace
}  // namespace optstep
