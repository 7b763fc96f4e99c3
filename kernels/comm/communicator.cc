#include "kernels/comm/communicator.h"

#include <cstddef>

namespace optstep {

size_t CommDTypeSize(CommDType dtype) {
  switch (dtype) {
    case CommDType::kFloat32:
      return 4;
    case CommDType::kFloat64:
      return 8;
    case CommDType::kUint8:
      return 1;
  }
  return 0;  // not a CommDType; the validation rejects it
}

}  // namespace optstep
