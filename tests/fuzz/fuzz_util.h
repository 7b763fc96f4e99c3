#ifndef OPTSTEP_TESTS_FUZZ_FUZZ_UTIL_H_
#define OPTSTEP_TESTS_FUZZ_FUZZ_UTIL_H_

// What every fuzz target of tests/fuzz uses: a property check that ends the run, and a quiet
// protobuf.

#include <google/protobuf/stubs/logging.h>

#include <cstdlib>

namespace optstep {
namespace fuzz {

// Aborts when a property does not hold: libFuzzer reports it as a crash and keeps the input.
inline void Check(bool condition) {
  if (!condition) std::abort();
}

// Protobuf logs every string field that is not UTF-8, and a fuzzer makes millions: drops the
// log. Answers true, so a target can call it from a static initialiser.
inline bool QuietProtobuf() {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}

}  // namespace fuzz
}  // namespace optstep

#endif  // OPTSTEP_TESTS_FUZZ_FUZZ_UTIL_H_
