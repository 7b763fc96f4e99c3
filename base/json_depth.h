#ifndef OPTSTEP_BASE_JSON_DEPTH_H_
#define OPTSTEP_BASE_JSON_DEPTH_H_

// How deeply JSON text nests, found without parsing it: a file from a shared disk or a peer may
// nest arrays a million deep, and although the parser takes that, printing or walking the value
// recurses once per level and overflows the stack. Callers refuse text deeper than they expect.

#include <cstddef>

#include "absl/strings/string_view.h"

namespace optstep {

// The deepest nesting of arrays and objects in `text` ("{}" is 1, "[[1]]" is 2), outside its
// strings (a bracket inside a string, also after an escaped quote, does not count). Stateless; for
// any text, JSON or not.
size_t JsonNestingDepth(absl::string_view text);

}  // namespace optstep

#endif  // OPTSTEP_BASE_JSON_DEPTH_H_
