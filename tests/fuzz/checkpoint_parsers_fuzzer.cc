// libFuzzer target for the two parsers that read checkpoint files written by others:
// ParseManifest (manifest.json) and the safetensors header parser. The first input byte picks
// the parser; the rest is the file. Besides "no crash, no sanitizer report", it checks two
// properties: a manifest that parses serialises and parses back to the same text, and a
// safetensors header that parses describes tensors inside the file, without overlaps.
//
// Built and run as tests/fuzz/BUILD says (libFuzzer under --config=asan, a replay elsewhere).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using optstep::fuzz::Check;

void FuzzManifest(absl::string_view text) {
  absl::StatusOr<optstep::Manifest> manifest = optstep::ParseManifest(text);
  if (!manifest.ok()) {
    Check(!manifest.status().message().empty());
    return;
  }
  absl::StatusOr<std::string> again = optstep::SerializeManifest(*manifest);
  Check(again.ok());
  absl::StatusOr<optstep::Manifest> reparsed = optstep::ParseManifest(*again);
  Check(reparsed.ok());
  absl::StatusOr<std::string> third = optstep::SerializeManifest(*reparsed);
  Check(third.ok() && *third == *again);
}

void FuzzSafetensors(absl::string_view file) {
  absl::StatusOr<uint64_t> n = optstep::ParseSafetensorsHeaderLength(file, file.size(), "fuzz");
  if (!n.ok()) return;
  absl::StatusOr<optstep::SafetensorsHeader> header =
      optstep::ParseSafetensorsHeader(file.substr(8, *n), file.size(), "fuzz");
  if (!header.ok()) return;
  Check(header->data_start == 8 + *n);
  uint64_t end = 0;
  for (const optstep::SafetensorsEntry& entry : header->entries) {
    Check(entry.begin == end && entry.begin <= entry.end);
    end = entry.end;
  }
  Check(end == file.size() - header->data_start);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    FuzzSafetensors(rest);
  } else {
    FuzzManifest(rest);
  }
  return 0;
}
