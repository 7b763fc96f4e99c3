// The keys of a state dict: which parameter a key belongs to, and which keys are a group's step
// counter, whatever the parameters are named.

#include "checkpoint/state_dict.h"

#include <optional>
#include <string>

#include "gtest/gtest.h"

namespace optstep {
namespace {

TEST(StateDictKeyTest, AKeyBelongsToItsParameterByExactName) {
  EXPECT_EQ(ParamNameOfKey("param/layers.0.w"), "layers.0.w");
  EXPECT_EQ(ParamNameOfKey("state/adamw/layers.0.w/exp_avg"), "layers.0.w");
  EXPECT_EQ(ParamNameOfKey("state/muon/a/b/momentum_buffer"), "a/b");
  EXPECT_EQ(ParamNameOfKey("meta/step"), std::nullopt);
  EXPECT_EQ(ParamNameOfKey("state/adamw"), std::nullopt);
}

// "state/<sub>/group<id>/step" is a group's counter, also in a session with a parameter named
// "group0" (whose state tensors are never named "step"): read as that parameter's, it was sent
// to its owner alone, and the other ranks kept their counter.
TEST(StateDictKeyTest, AGroupCounterIsNoParametersWhateverItsName) {
  EXPECT_TRUE(IsGroupStepKey("state/adamw/group0/step"));
  EXPECT_TRUE(IsGroupStepKey("state/muon/group12/step"));
  EXPECT_EQ(ParamNameOfKey("state/adamw/group0/step"), std::nullopt);
  EXPECT_EQ(ParamNameOfKey("state/adamw/group0/exp_avg"), "group0");
  EXPECT_FALSE(IsGroupStepKey("state/adamw/group/step"));
  EXPECT_FALSE(IsGroupStepKey("state/adamw/groupx/step"));
  EXPECT_FALSE(IsGroupStepKey("state/adamw/group0/steps"));
  EXPECT_FALSE(IsGroupStepKey("param/group0"));
  EXPECT_FALSE(IsGroupStepKey("state/group0/step"));
}

}  // namespace
}  // namespace optstep
