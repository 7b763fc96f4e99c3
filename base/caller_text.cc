#include "base/caller_text.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace optstep {

std::string CallerText(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return absl::CHexEscape(text);
  return absl::StrCat(absl::CHexEscape(text.substr(0, max_bytes)), "...(", text.size(), " bytes)");
}

std::string LogValue(absl::string_view text) {
  std::string value;
  value.reserve(text.size());
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {
      absl::StrAppend(&value, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else if (ch == '"' || ch == '\\') {
      value += '\\';
      value += ch;
    } else {
      value += ch;
    }
  }
  return value;
}

absl::Status CheckCallerName(absl::string_view what, absl::string_view name, size_t max_bytes) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", CallerText(name), "' ", why));
  };
  if (name.size() > max_bytes) {
    return bad(absl::StrCat("has ", name.size(), " bytes (at most ", max_bytes, ")"));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f) {
      return bad(absl::StrCat("contains the control character '",
                              absl::CHexEscape(name.substr(i, 1)), "' at byte ", i,
                              " (bytes 0x00-0x1f and 0x7f are refused)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace optstep
