#ifndef OPTSTEP_CLIENT_CPP_EXAMPLES_MLP_H_
#define OPTSTEP_CLIENT_CPP_EXAMPLES_MLP_H_

// A small two-layer perceptron (tanh hidden layer, softmax cross-entropy) on a deterministic
// synthetic classification set: the model that the demo trainer and the integration tests train
// through the service. Gradients are computed by hand in float64 and returned as fp32.

#include <cstdint>
#include <string>
#include <vector>

#include "optstep/v1/session.pb.h"

namespace optstep {
namespace examples {

struct MlpShape {
  int inputs = 8;
  int hidden = 32;
  int classes = 4;
};

// Gaussian blobs: `n` samples of `shape.classes` classes around fixed random centres.
struct Dataset {
  std::vector<std::vector<float>> x;
  std::vector<int> y;
};
Dataset MakeBlobs(const MlpShape& shape, int n, uint64_t seed);

// Parameters in declaration order: fc1.weight [hidden, inputs], fc1.bias [hidden],
// fc2.weight [classes, hidden], fc2.bias [classes].
struct ParamDecl {
  std::string name;
  std::vector<uint64_t> shape;
};
std::vector<ParamDecl> MlpParams(const MlpShape& shape);

// A session of MlpParams(shape): one trainer, SHARDED gradients, no optimizer chosen yet.
v1::SessionSpec MlpSessionSpec(const MlpShape& shape);

// Deterministic small random initial values, one vector per parameter.
std::vector<std::vector<float>> InitMlp(const MlpShape& shape, uint64_t seed);

struct LossAndGrads {
  double loss = 0.0;
  double accuracy = 0.0;
  std::vector<std::vector<float>> grads;  // per parameter, mean over the batch
};
// Loss and gradients over samples [begin, end) of `data`.
LossAndGrads Evaluate(const MlpShape& shape, const std::vector<std::vector<float>>& params,
                      const Dataset& data, int begin, int end);

}  // namespace examples
}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CPP_EXAMPLES_MLP_H_
