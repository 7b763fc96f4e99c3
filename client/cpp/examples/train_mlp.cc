// train_mlp: a trainer that fits a small MLP through an optstep server and prints the loss.
//
//   train_mlp --server=localhost:50051 --optimizer=adam --steps=200
//
// Each step: compute the gradients locally from the current parameters, push them, receive the
// updated parameters. Exits non-zero unless the loss fell to below --target_loss.

#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "client/cpp/client.h"
#include "client/cpp/examples/mlp.h"

ABSL_FLAG(std::string, server, "localhost:50051", "Address of rank 0.");
ABSL_FLAG(std::string, optimizer, "adam", "Megatron-style preset: adam or sgd.");
ABSL_FLAG(double, lr, 0.0, "Learning rate; 0 = 1e-2 for adam, 0.1 for sgd.");
ABSL_FLAG(int, steps, 200, "Optimizer steps.");
ABSL_FLAG(int, samples, 512, "Training samples (full batch).");
ABSL_FLAG(double, target_loss, 0.5, "Fail unless the final loss is below this.");

namespace optstep {
namespace {

int Run() {
  using examples::MlpShape;
  const MlpShape shape;
  const examples::Dataset data = examples::MakeBlobs(shape, absl::GetFlag(FLAGS_samples), 1);
  std::vector<std::vector<float>> params = examples::InitMlp(shape, 2);

  ClientOptions options;
  options.target = absl::GetFlag(FLAGS_server);
  auto client = Client::Connect(options);
  if (!client.ok()) {
    std::cerr << "connect: " << client.status() << "\n";
    return 1;
  }
  const std::string optimizer = absl::GetFlag(FLAGS_optimizer);
  double lr = absl::GetFlag(FLAGS_lr);
  if (lr == 0.0) lr = optimizer == "sgd" ? 0.1 : 1e-2;

  v1::SessionSpec spec = examples::MlpSessionSpec(shape);
  spec.mutable_optimizer()->set_preset(optimizer);
  (*spec.mutable_optimizer()->mutable_megatron_args())["lr"] = absl::StrFormat("%g", lr);
  auto session = (*client)->CreateSession(spec);
  if (!session.ok()) {
    std::cerr << "create session: " << session.status() << "\n";
    return 1;
  }
  std::printf("session %s: %d parameters, optimizer %s (lr %g), %zu groups\n",
              session->session_id().c_str(), spec.parameters_size(), optimizer.c_str(), lr,
              static_cast<size_t>(session->groups_size()));
  for (uint32_t p = 0; p < params.size(); ++p) {
    absl::Status status = (*client)->InitParameters(session->session_id(), p, params[p]);
    if (!status.ok()) {
      std::cerr << "init: " << status << "\n";
      return 1;
    }
  }

  const int steps = absl::GetFlag(FLAGS_steps);
  double loss = 0.0;
  for (int step = 1; step <= steps; ++step) {
    examples::LossAndGrads eval = examples::Evaluate(shape, params, data, 0, data.y.size());
    loss = eval.loss;
    std::vector<FullGradient> grads;
    for (uint32_t p = 0; p < eval.grads.size(); ++p) grads.push_back({p, eval.grads[p]});
    StepOptions step_options;
    step_options.session_id = session->session_id();
    step_options.step = step;
    auto reply = (*client)->Step(step_options, grads);
    if (!reply.ok()) {
      std::cerr << "step " << step << ": " << reply.status() << "\n";
      return 1;
    }
    for (auto& [id, param] : reply->params) params[id] = std::move(param.f32);
    if (step == 1 || step % 20 == 0 || step == steps) {
      std::printf("step %4d  loss %.4f  accuracy %5.1f%%  grad_norm %.4f%s\n", step, eval.loss,
                  100.0 * eval.accuracy, reply->grad_norm, reply->clipped ? " (clipped)" : "");
    }
  }
  loss = examples::Evaluate(shape, params, data, 0, data.y.size()).loss;
  std::printf("final loss %.4f\n", loss);
  (void)(*client)->CloseSession(session->session_id());
  return loss < absl::GetFlag(FLAGS_target_loss) ? 0 : 2;
}

}  // namespace
}  // namespace optstep

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return optstep::Run();
}
