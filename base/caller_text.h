#ifndef OPTSTEP_BASE_CALLER_TEXT_H_
#define OPTSTEP_BASE_CALLER_TEXT_H_

// Text that a caller chose (session and parameter names, session ids, checkpoint names) on its
// way into an error message or a log line: shown C-escaped and cut short, so that a control
// character or a megabyte of it reaches neither raw. Stateless.

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace optstep {

// `text` C-escaped (absl::CHexEscape); beyond its first `max_bytes` bytes, "..." and the whole
// length: "abc...(70000 bytes)".
std::string CallerText(absl::string_view text, size_t max_bytes = 64);

// `text` as the quoted value of a log line (key="..."): each control character (bytes 0x00-0x1f,
// 0x7f) as \xNN, '"' as \" and '\' as \\, so that no text, a caller's among it (escaped once
// already by CallerText or not), ends the value or the line and forges another. Everything else
// as it is.
std::string LogValue(absl::string_view text);

// OK when `name` has at most `max_bytes` bytes and no control character (bytes 0x00-0x1f and
// 0x7f); else INVALID_ARGUMENT that begins "<what> '<CallerText(name)>' " and says which.
absl::Status CheckCallerName(absl::string_view what, absl::string_view name, size_t max_bytes);

}  // namespace optstep

#endif  // OPTSTEP_BASE_CALLER_TEXT_H_
