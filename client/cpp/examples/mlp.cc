#include "client/cpp/examples/mlp.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace optstep {
namespace examples {

Dataset MakeBlobs(const MlpShape& shape, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<std::vector<double>> centres(shape.classes, std::vector<double>(shape.inputs));
  for (auto& c : centres) {
    for (double& v : c) v = 1.5 * normal(rng);
  }
  Dataset data;
  for (int i = 0; i < n; ++i) {
    const int label = i % shape.classes;
    std::vector<float> x(shape.inputs);
    for (int j = 0; j < shape.inputs; ++j) x[j] = static_cast<float>(centres[label][j] + normal(rng));
    data.x.push_back(std::move(x));
    data.y.push_back(label);
  }
  return data;
}

std::vector<ParamDecl> MlpParams(const MlpShape& s) {
  return {{"fc1.weight", {uint64_t(s.hidden), uint64_t(s.inputs)}},
          {"fc1.bias", {uint64_t(s.hidden)}},
          {"fc2.weight", {uint64_t(s.classes), uint64_t(s.hidden)}},
          {"fc2.bias", {uint64_t(s.classes)}}};
}

v1::SessionSpec MlpSessionSpec(const MlpShape& shape) {
  v1::SessionSpec spec;
  for (const ParamDecl& p : MlpParams(shape)) {
    v1::ParameterSpec* param = spec.add_parameters();
    param->set_name(p.name);
    for (uint64_t d : p.shape) param->add_shape(d);
  }
  spec.set_num_trainers(1);
  spec.set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
  return spec;
}

std::vector<std::vector<float>> InitMlp(const MlpShape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<std::vector<float>> params;
  for (const ParamDecl& p : MlpParams(s)) {
    const uint64_t fan_in = p.shape.size() == 2 ? p.shape[1] : 1;
    uint64_t n = 1;
    for (uint64_t d : p.shape) n *= d;
    std::vector<float> values(n);
    for (float& v : values) v = static_cast<float>(uniform(rng) / std::sqrt(double(fan_in)));
    params.push_back(std::move(values));
  }
  return params;
}

LossAndGrads Evaluate(const MlpShape& s, const std::vector<std::vector<float>>& params,
                      const Dataset& data, int begin, int end) {
  const std::vector<float>& w1 = params[0];
  const std::vector<float>& b1 = params[1];
  const std::vector<float>& w2 = params[2];
  const std::vector<float>& b2 = params[3];
  std::vector<double> gw1(w1.size()), gb1(b1.size()), gw2(w2.size()), gb2(b2.size());
  std::vector<double> h(s.hidden), logits(s.classes), dlogits(s.classes), dh(s.hidden);
  LossAndGrads out;
  const int n = end - begin;
  int correct = 0;
  for (int i = begin; i < end; ++i) {
    const std::vector<float>& x = data.x[i];
    for (int j = 0; j < s.hidden; ++j) {
      double a = b1[j];
      for (int k = 0; k < s.inputs; ++k) a += double(w1[j * s.inputs + k]) * x[k];
      h[j] = std::tanh(a);
    }
    double max_logit = -1e300;
    for (int c = 0; c < s.classes; ++c) {
      double a = b2[c];
      for (int j = 0; j < s.hidden; ++j) a += double(w2[c * s.hidden + j]) * h[j];
      logits[c] = a;
      max_logit = std::max(max_logit, a);
    }
    double z = 0.0;
    for (int c = 0; c < s.classes; ++c) z += std::exp(logits[c] - max_logit);
    const int label = data.y[i];
    out.loss += -(logits[label] - max_logit - std::log(z)) / n;
    const int predicted = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
    correct += predicted == label;
    for (int c = 0; c < s.classes; ++c) {
      dlogits[c] = (std::exp(logits[c] - max_logit) / z - (c == label ? 1.0 : 0.0)) / n;
      gb2[c] += dlogits[c];
      for (int j = 0; j < s.hidden; ++j) gw2[c * s.hidden + j] += dlogits[c] * h[j];
    }
    for (int j = 0; j < s.hidden; ++j) {
      double d = 0.0;
      for (int c = 0; c < s.classes; ++c) d += dlogits[c] * w2[c * s.hidden + j];
      dh[j] = d * (1.0 - h[j] * h[j]);
      gb1[j] += dh[j];
      for (int k = 0; k < s.inputs; ++k) gw1[j * s.inputs + k] += dh[j] * x[k];
    }
  }
  out.accuracy = double(correct) / n;
  for (const auto* g : {&gw1, &gb1, &gw2, &gb2}) {
    out.grads.emplace_back(g->begin(), g->end());
  }
  return out;
}

}  // namespace examples
}  // namespace optstep
