// CallerText and CheckCallerName: what a caller chose reaches a message escaped and bounded;
// LogValue: a message reaches a log line's quoted value without ending it.

#include "base/caller_text.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace optstep {
namespace {

using ::testing::HasSubstr;

TEST(CallerTextTest, EscapesControlCharactersAndCutsLongText) {
  EXPECT_EQ(CallerText("plain"), "plain");
  EXPECT_EQ(CallerText("a\nb\x01"), "a\\nb\\x01");
  EXPECT_EQ(CallerText(std::string(70000, 'x'), 4), "xxxx...(70000 bytes)");
  EXPECT_EQ(CallerText(std::string(64, 'y')), std::string(64, 'y'));
  EXPECT_EQ(CallerText(std::string(65, 'y')).size(), 64u + std::string("...(65 bytes)").size());
}

// A status message in a log line's quoted value: a caller's newline could otherwise end the line
// and forge another ("event=peer_lost ...").
TEST(CallerTextTest, LogValueEscapesWhatCouldEndTheValueOrTheLine) {
  EXPECT_EQ(LogValue("session 's1': step 3 out of sequence"),
            "session 's1': step 3 out of sequence");
  EXPECT_EQ(LogValue("kind 'x\nevent=peer_lost rank=9\r'"),
            "kind 'x\\x0aevent=peer_lost rank=9\\x0d'");
  EXPECT_EQ(LogValue("a \"quoted\" \x7f"), "a \\\"quoted\\\" \\x7f");
  // A backslash is escaped too: text escaped once already (CallerText) cannot end the value with
  // its own backslash before a quote.
  EXPECT_EQ(LogValue("x\\\" event=forged"), "x\\\\\\\" event=forged");
}

TEST(CallerTextTest, CheckCallerNameRefusesLengthAndControlCharacters) {
  EXPECT_TRUE(CheckCallerName("session name", "run-1.layers/0", 255).ok());
  EXPECT_TRUE(CheckCallerName("session name", "", 255).ok());
  const absl::Status control = CheckCallerName("session name", "a\x1b[2Jb", 255);
  EXPECT_EQ(control.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(control.message(),
            "session name 'a\\x1b[2Jb' contains the control character '\\x1b' at byte 1 (bytes "
            "0x00-0x1f and 0x7f are refused)");
  EXPECT_FALSE(CheckCallerName("x", "del\x7f", 255).ok());
  const absl::Status long_name = CheckCallerName("parameter name", std::string(2000, 'p'), 1024);
  EXPECT_EQ(long_name.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(long_name.message()),
              HasSubstr("...(2000 bytes)' has 2000 bytes (at most 1024)"));
  EXPECT_LT(long_name.message().size(), 200u);
}

}  // namespace
}  // namespace optstep
