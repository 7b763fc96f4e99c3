// One whole optimizer step, end to end: a GPT-2-small-like model (124M parameters,
// bench/gpt_layout.h) on two ranks (two servers in this process, Gloo between them), two
// trainers (SHARDED: each sends half of every parameter's gradient, fp32; or --replicated: each
// sends all of it) and AdamW; trainer 0 gets every parameter back (bf16 by default) from its
// owner, as soon as it is stepped.
// At the end it prints the peak RSS next to the bytes the sessions and the bench's buffers hold.
//
//   bazel run -c opt //bench:step_bench -- --steps=6   (5 measured after a warm-up step)
//   bazel run -c opt //bench:step_bench -- --replicated --trainers=4   (memory across trainers)
//   bazel run -c opt //bench:step_bench -- --state_redundancy          (its step and memory cost)
//   bazel run -c opt //bench:step_bench -- --owners   (OWNERS storage: no replica, no all-gather)
//   step_bench --gpt_like --layers=24 --optimizer=sgd --owners --trainers=1 --bf16_gradients
//       --destinations --nopull_alone --ranks=4 --json=F   (1.3B, as scale_model.py --check runs
//       it)
//
// Per step it prints the wall time of the trainers' Step calls, the server-side phases
// (StepObserver, the longest over ranks and streams): ingest (first step header -> every
// contribution committed), step (statistics, agreement, clipping, AdamW), all-gather, egress
// (first -> last parameter chunk written, which in the pipeline runs under the step and the
// all-gather), and the same egress alone: both trainers pulling every parameter at once after
// the step (PullParameters, the step's snapshot, nothing else running). Overlap = wall /
// (ingest + step + all-gather + egress alone), the sum of the phases run one after the other:
// about 1 without a pipeline, below 1 as far as the phases overlap. The last lines give the
// means over the measured steps (every step after the first) and the overlap of those means.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "bench/gpt_layout.h"
#include "bench/gpt_like_layout.h"
#include "bench/in_process_ranks.h"
#include "bench/phase_recorder.h"
#include "client/cpp/client.h"
#include "kernels/comm/key_value_store.h"
#include "kernels/math/half.h"
#include "server/engine/engine.h"
#include "server/rpc/auto_checkpoint.h"
#include "server/rpc/rank_group.h"
#include "server/rpc/server.h"

ABSL_FLAG(int, steps, 6, "Steps to run; the first one warms up and is not averaged.");
ABSL_FLAG(int, layers, 12, "Transformer layers of the model (12: 124M parameters).");
ABSL_FLAG(bool, gpt_like, false,
          "The scale model's GPT-like layout of --layers and the flags of "
          "bench/gpt_like_layout.h (1.3B by default) instead of the GPT-2-small one.");
ABSL_FLAG(int, ranks, 2, "Ranks (in this process, Gloo between them).");
ABSL_FLAG(std::string, optimizer, "adamw",
          "adamw, or sgd (no momentum: no optimizer state, for models whose AdamW state does not "
          "fit this machine).");
ABSL_FLAG(bool, bf16_gradients, false, "The trainers send bf16 gradients instead of fp32.");
ABSL_FLAG(bool, pull_alone, true,
          "Time the egress alone after each step (a pull; under REPLICATED storage it makes rank "
          "0 build a whole snapshot: one more copy of the model).");
ABSL_FLAG(bool, destinations, false,
          "Trainer 0 has each returned (and pulled) parameter written into its own buffer, "
          "allocated once (as the Python client writes into the model's tensors), instead of a "
          "new reply each step.");
ABSL_FLAG(int, think_ms, 0,
          "Pause this long before each step, as a trainer's forward and backward pass would: "
          "the ranks are idle meanwhile (not counted in the step's wall time).");
ABSL_FLAG(std::string, json, "",
          "Set: also write the run's figures as one JSON object to this file "
          "(bench/scale_model.py --check reads it).");
ABSL_FLAG(bool, fp32_return, false, "Return the parameters as fp32 instead of bf16.");
ABSL_FLAG(int, trainers, 2, "Trainers (threads, each with its own client).");
ABSL_FLAG(bool, state_redundancy, false,
          "Each rank keeps a shadow of the other's optimizer state, stepped every step "
          "(docs/design.md, \"State redundancy\"): run once with and once without to compare.");
ABSL_FLAG(std::string, auto_checkpoint_dir, "",
          "Set: rank 0 saves the session as an automatic checkpoint after every step under this "
          "directory (in the background, from a snapshot), as --checkpoint_every_steps=1 does; "
          "compare the step wall with a run without.");
ABSL_FLAG(
    bool, owners, false,
    "OWNERS parameter storage: each rank keeps only the masters it owns, nothing is "
    "all-gathered (trainer 0 gets each parameter from its owner either way; docs/design.md §4); "
    "run once with and once without to compare.");
ABSL_FLAG(int, stream_window_bytes, 16 << 20,
          "The ranks' HTTP/2 window for each stream they receive (--stream_window_bytes).");
ABSL_FLAG(bool, replicated, false,
          "REPLICATED: every trainer sends the whole gradient (the same buffer), instead of "
          "SHARDED halves.");

namespace optstep {
namespace {

v1::SessionSpec GptSpec(const std::vector<ParamInfo>& params) {
  v1::SessionSpec spec;
  spec.set_name("gpt");
  for (const ParamInfo& p : params) {
    v1::ParameterSpec* param = spec.add_parameters();
    param->set_name(p.name);
    for (int64_t d : p.shape) param->add_shape(static_cast<uint64_t>(d));
    param->set_embedding_or_output(p.embedding_or_output);
  }
  spec.set_num_trainers(absl::GetFlag(FLAGS_trainers));
  spec.set_gradient_mode(absl::GetFlag(FLAGS_replicated) ? v1::GRADIENT_MODE_REPLICATED
                                                         : v1::GRADIENT_MODE_SHARDED);
  v1::SubOptimizer* optimizer = spec.mutable_optimizer()->add_sub_optimizers();
  if (absl::GetFlag(FLAGS_optimizer) == "sgd") {
    optimizer->set_name("sgd");
    optimizer->set_kind("sgd");
    optimizer->mutable_sgd()->set_lr(1e-4);
    optimizer->mutable_sgd()->set_weight_decay(0.01);
  } else {
    optimizer->set_name("adamw");
    optimizer->set_kind("adamw");
    optimizer->mutable_adamw()->set_lr(1e-4);
    optimizer->mutable_adamw()->set_weight_decay(0.01);
  }
  spec.mutable_optimizer()->set_clip_grad(1.0);
  spec.set_step_deadline_ms(600000);
  if (absl::GetFlag(FLAGS_owners)) spec.set_parameter_storage(v1::PARAMETER_STORAGE_OWNERS);
  return spec;
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// The model of the flags: the GPT-2-small-like layout of --layers, or with --gpt_like the scale
// model's GPT-like one.
std::vector<ParamInfo> Layout() {
  const int layers = absl::GetFlag(FLAGS_layers);
  if (absl::GetFlag(FLAGS_gpt_like)) return bench::GptLikeLayout(bench::GptLikeFromFlags(layers));
  std::vector<ParamInfo> params = bench::GptRest(bench::GptShape());
  for (int l = 0; l < layers; ++l) {
    std::vector<ParamInfo> layer = bench::GptLayer(bench::GptShape(), l);
    params.insert(params.end(), layer.begin(), layer.end());
  }
  return params;
}

// One trainer's thread for the whole run, as a training loop is, running `step(n)` when told.
// (A thread per step allocated each reply in another malloc arena than the step before, and the
// arenas kept the freed replies: a peak RSS that grew over the steps.) Thread-safe.
class TrainerThread {
 public:
  explicit TrainerThread(std::function<absl::Status(int)> step)
      : step_(std::move(step)), thread_([this] { Loop(); }) {}
  ~TrainerThread() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  // Starts step `n`. REQUIRES: the last step started was waited for.
  void Start(int n) {
    absl::MutexLock lock(&mu_);
    next_ = n;
  }
  // Waits for the step last started; answers its status.
  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](TrainerThread* t) ABSL_NO_THREAD_SAFETY_ANALYSIS { return t->done_ == t->next_; },
        this));
    return status_;
  }

 private:
  void Loop() {
    while (true) {
      int n;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](TrainerThread* t)
                 ABSL_NO_THREAD_SAFETY_ANALYSIS { return t->stop_ || t->next_ != t->done_; },
            this));
        if (stop_) return;
        n = next_;
      }
      absl::Status status = step_(n);
      absl::MutexLock lock(&mu_);
      status_ = std::move(status);
      done_ = n;
    }
  }

  const std::function<absl::Status(int)> step_;
  absl::Mutex mu_;
  int next_ ABSL_GUARDED_BY(mu_) = 0;
  int done_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts once the rest is set
};

int Run() {
  if (absl::GetFlag(FLAGS_optimizer) != "adamw" && absl::GetFlag(FLAGS_optimizer) != "sgd") {
    std::fprintf(stderr, "--optimizer: '%s' is neither adamw nor sgd\n",
                 absl::GetFlag(FLAGS_optimizer).c_str());
    return 1;
  }
  const int kTrainers = absl::GetFlag(FLAGS_trainers);
  const int kRanks = absl::GetFlag(FLAGS_ranks);
  const bool replicated = absl::GetFlag(FLAGS_replicated);
  const std::vector<ParamInfo> params = Layout();
  const int64_t numel = bench::CountElements(params);

  auto recorder = std::make_shared<bench::PhaseRecorder>();
  bench::InProcessRankOptions rank_options;
  rank_options.world_size = absl::GetFlag(FLAGS_ranks);
  rank_options.observer = recorder;
  rank_options.state_redundancy = absl::GetFlag(FLAGS_state_redundancy);
  rank_options.checkpoint_root = absl::GetFlag(FLAGS_auto_checkpoint_dir);
  rank_options.stream_window_bytes = absl::GetFlag(FLAGS_stream_window_bytes);
  auto ranks = bench::StartInProcessRanks(rank_options, NewInMemoryKeyValueStore());
  if (!ranks.ok()) {
    std::fprintf(stderr, "cannot start the ranks: %s\n", ranks.status().ToString().c_str());
    return 1;
  }
  ClientOptions client_options;
  for (const bench::InProcessRank& rank : *ranks)
    client_options.rank_targets.push_back(rank.address);
  std::vector<std::unique_ptr<Client>> trainers;
  for (int t = 0; t < kTrainers; ++t) {
    auto client = Client::Connect(client_options);
    if (!client.ok()) return 1;
    trainers.push_back(*std::move(client));
  }
  // What the process holds before the session (code, the ranks' servers and threads, the
  // clients): the fixed overhead, which does not grow with the model.
  const int64_t before_session = bench::PeakRssBytes();
  auto session = trainers[0]->CreateSession(GptSpec(params));
  if (!session.ok()) {
    std::fprintf(stderr, "cannot create the session: %s\n", session.status().ToString().c_str());
    return 1;
  }

  // One gradient for the whole model (fp32, or bf16); SHARDED: trainer t sends the t-th part of
  // every parameter; REPLICATED: every trainer sends all of it (the same bytes).
  const bool bf16_gradients = absl::GetFlag(FLAGS_bf16_gradients);
  const int64_t element_in = bf16_gradients ? 2 : 4;
  const int64_t element_out = absl::GetFlag(FLAGS_fp32_return) ? 4 : 2;
  std::vector<uint8_t> gradient(numel * element_in);
  for (int64_t i = 0; i < numel; ++i) {
    const float value = 1e-4f * static_cast<float>(i % 2001 - 1000);
    if (bf16_gradients) {
      const uint16_t bits = math::FloatToBf16(value);
      std::memcpy(gradient.data() + 2 * i, &bits, 2);
    } else {
      std::memcpy(gradient.data() + 4 * i, &value, 4);
    }
  }
  std::vector<std::vector<GradientSlice>> slices(kTrainers);
  int64_t at = 0;
  for (size_t p = 0; p < params.size(); ++p) {
    const int64_t n = params[p].numel();
    for (int t = 0; t < kTrainers; ++t) {
      const int64_t begin = replicated ? 0 : n * t / kTrainers;
      const int64_t end = replicated ? n : n * (t + 1) / kTrainers;
      GradientSlice slice;
      slice.param_id = static_cast<uint32_t>(p);
      slice.offset = static_cast<uint64_t>(begin);
      slice.dtype = bf16_gradients ? DType::kBF16 : DType::kF32;
      slice.bytes = absl::Span<const uint8_t>(gradient.data() + (at + begin) * element_in,
                                              (end - begin) * element_in);
      slices[t].push_back(slice);
    }
    at += n;
  }

  // Automatic checkpoints after every step, with the time each save took (snapshot and write).
  std::unique_ptr<AutoCheckpointer> saver;
  if (!absl::GetFlag(FLAGS_auto_checkpoint_dir).empty()) {
    AutoCheckpointOptions auto_options;
    auto_options.checkpoint_root = absl::GetFlag(FLAGS_auto_checkpoint_dir);
    auto_options.every_steps = 1;
    auto_options.on_saved = [](const AutoCheckpointSaved& saved) {
      std::printf(
          "      automatic checkpoint of step %llu: rank 0 held %.1f ms, saved in %.1f ms\n",
          static_cast<unsigned long long>(saved.step), Ms(saved.held), Ms(saved.total));
    };
    saver = std::make_unique<AutoCheckpointer>(auto_options, (*ranks)[0].engine.get(),
                                               (*ranks)[0].group.get());
    saver->Start();
  }
  const bool fp32 = absl::GetFlag(FLAGS_fp32_return);
  const bool owners = absl::GetFlag(FLAGS_owners);
  const std::string optimizer = absl::GetFlag(FLAGS_optimizer);
  std::printf(
      "%zu parameters, %.1fM elements; %d ranks, %d trainers (%s), %s; "
      "%.0f MiB of %s gradients in, %s parameters back to trainer 0; state redundancy %s; "
      "parameter storage %s\n",
      params.size(), numel / 1e6, kRanks, kTrainers, replicated ? "REPLICATED" : "SHARDED",
      optimizer.c_str(), numel * element_in * (replicated ? kTrainers : 1.0) / (1 << 20),
      bf16_gradients ? "bf16" : "fp32", fp32 ? "fp32" : "bf16",
      absl::GetFlag(FLAGS_state_redundancy) ? "on" : "off", owners ? "OWNERS" : "REPLICATED");
  std::printf("%-5s %9s %9s %9s %10s %9s %9s %9s %8s %9s\n", "step", "wall ms", "ingest", "step",
              "all-gather", "egress", "alone", "sum", "overlap", "peak MiB");
  double total_wall = 0.0, total_sum = 0.0, total_overlap = 0.0;
  double total_phases[5] = {};  // ingest, step, all-gather, egress, egress alone
  int measured = 0;
  // --destinations: trainer 0's parameters, written in place each step.
  std::vector<uint8_t> returned_params;
  ParamDestinations destinations;
  if (absl::GetFlag(FLAGS_destinations)) {
    returned_params.resize(numel * element_out);
    int64_t offset = 0;
    for (size_t p = 0; p < params.size(); ++p) {
      const int64_t bytes = params[p].numel() * element_out;
      destinations[static_cast<uint32_t>(p)] =
          absl::Span<uint8_t>(returned_params.data() + offset, bytes);
      offset += bytes;
    }
  }
  std::vector<std::unique_ptr<TrainerThread>> trainer_threads;
  for (int t = 0; t < kTrainers; ++t) {
    trainer_threads.push_back(std::make_unique<TrainerThread>([&, t](int step) {
      StepOptions options;
      options.session_id = session->session_id();
      options.step = step;
      options.trainer_id = t;
      options.return_dtype = fp32 ? DType::kF32 : DType::kBF16;
      options.skip_return = t != 0;  // the client memory stays that of one trainer
      if (t == 0 && !destinations.empty()) {
        return trainers[t]->Step(options, slices[t], destinations).status();
      }
      return trainers[t]->Step(options, slices[t]).status();
    }));
  }
  for (int step = 1; step <= absl::GetFlag(FLAGS_steps); ++step) {
    absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_think_ms)));
    recorder->Take();
    const absl::Time start = absl::Now();
    for (auto& trainer : trainer_threads) trainer->Start(step);
    std::vector<absl::Status> results;
    for (auto& trainer : trainer_threads) results.push_back(trainer->Wait());
    const double wall = Ms(absl::Now() - start);
    for (const absl::Status& status : results) {
      if (!status.ok()) {
        std::fprintf(stderr, "step %d: %s\n", step, status.ToString().c_str());
        return 1;
      }
    }
    const bench::PhaseRecorder::Durations phases = recorder->Take();
    double alone = 0.0;  // without --pull_alone
    if (absl::GetFlag(FLAGS_pull_alone)) {
      // The egress alone: the trainer that got them pulls the parameters the step returned, a
      // second time (the first makes the ranks' snapshot where the step's streams were sent from
      // partial ones, of each rank's own parameters), so that only the sending is timed.
      const auto pull = [&] {
        return trainers[0]
            ->PullParameters(session->session_id(), fp32 ? DType::kF32 : DType::kBF16, {},
                             destinations)
            .status();
      };
      absl::Status pulled = pull();
      const absl::Time pull_start = absl::Now();
      if (pulled.ok()) pulled = pull();
      alone = Ms(absl::Now() - pull_start);
      if (!pulled.ok()) {
        std::fprintf(stderr, "pull after step %d: %s\n", step, pulled.ToString().c_str());
        return 1;
      }
      recorder->Take();
    }
    const double sum = Ms(phases[0]) + Ms(phases[1]) + Ms(phases[2]) + alone;
    // The process's peak RSS so far: flat from step 1 on when nothing grows per step.
    std::printf("%-5d %9.1f %9.1f %9.1f %10.1f %9.1f %9.1f %9.1f %8.2f %9.0f%s\n", step, wall,
                Ms(phases[0]), Ms(phases[1]), Ms(phases[2]), Ms(phases[3]), alone, sum, wall / sum,
                bench::PeakRssBytes() / 1048576.0, step == 1 ? "  (warm-up)" : "");
    if (step > 1) {
      total_wall += wall;
      total_sum += sum;
      total_overlap += wall / sum;
      for (int i = 0; i < 4; ++i) total_phases[i] += Ms(phases[i]);
      total_phases[4] += alone;
      ++measured;
    }
  }
  if (measured > 0) {
    const double n = measured;
    std::printf("%-5s %9.1f %9.1f %9.1f %10.1f %9.1f %9.1f %9.1f %8.2f\n", "mean", total_wall / n,
                total_phases[0] / n, total_phases[1] / n, total_phases[2] / n, total_phases[3] / n,
                total_phases[4] / n, total_sum / n, total_wall / total_sum);
    std::printf(
        "mean of %d steps: wall %.1f ms, overlap %.2f (mean wall / mean sum; the mean of "
        "the steps' overlaps %.2f)\n",
        measured, total_wall / n, total_wall / total_sum, total_overlap / n);
  }
  // Memory: what the sessions hold (fp32 masters on every rank, or under OWNERS the owned ones,
  // the optimizer's state and one gradient buffer per owned parameter; under state redundancy
  // also the shadow of the predecessor's owned masters, state and gradients) and the bench's own
  // buffers (the one gradient every trainer sends from, trainer 0's returned parameters, the
  // ranks' reply snapshots), against peak RSS.
  // Per step and rank: the all-gather's bytes each way (REPLICATED: the other rank's masters)
  // and the parameters it sends trainer 0 (its own, under either storage).
  int64_t session_bytes = 0;
  std::string json_ranks;  // --json: each rank's owned elements and held bytes
  for (int r = 0; r < kRanks; ++r) {
    auto held = (*ranks)[r].engine->GetSession(session->session_id());
    if (!held.ok()) continue;
    const SessionStats stats = (*held)->stats();
    const int64_t held_bytes =
        stats.param_bytes + stats.state_bytes + stats.buffer_bytes + stats.shadow_bytes;
    session_bytes += held_bytes;
    int64_t owned = 0;
    for (size_t p = 0; p < params.size(); ++p) {
      if ((*held)->layout().owner[p] == r) owned += params[p].numel();
    }
    const int64_t gathered = owners ? 0 : (numel - owned) * 4;
    const int64_t out = owned * element_out;
    std::printf(
        "rank %d: owns %.1fM elements; per step all-gather %.0f MiB in and %.0f MiB out, "
        "%.0f MiB of parameters to trainer 0; holds %.0f MiB (masters %.0f, state %.0f, "
        "gradients %.0f, shadow %.0f)\n",
        r, owned / 1e6, gathered / 1048576.0, (owners ? 0 : owned * 4) / 1048576.0, out / 1048576.0,
        held_bytes / 1048576.0, stats.param_bytes / 1048576.0, stats.state_bytes / 1048576.0,
        stats.buffer_bytes / 1048576.0, stats.shadow_bytes / 1048576.0);
    absl::StrAppend(&json_ranks, r == 0 ? "" : ", ", "{\"owned_numel\": ", owned,
                    ", \"param_bytes\": ", stats.param_bytes,
                    ", \"state_bytes\": ", stats.state_bytes,
                    ", \"buffer_bytes\": ", stats.buffer_bytes,
                    ", \"shadow_bytes\": ", stats.shadow_bytes, "}");
  }
  const int64_t returned = numel * element_out;
  // The ranks' reply snapshots: one copy of the model between them, in the dtype returned (each
  // rank its own parameters; a rank reuses the last step's snapshot for the next step, or frees
  // it before it makes that step's, so the two are never kept together). Under REPLICATED those
  // are partial (never published), so the pulls after each step make rank 0 build a whole one
  // beside them: one more copy.
  const int64_t snapshots = owners || !absl::GetFlag(FLAGS_pull_alone) ? returned : 2 * returned;
  const int64_t bench_bytes = numel * element_in + returned + snapshots;
  std::printf(
      "memory: sessions hold %.0f MiB, bench buffers %.0f MiB, peak RSS %.0f MiB "
      "(%.2f x what is held)\n",
      session_bytes / 1048576.0, bench_bytes / 1048576.0, bench::PeakRssBytes() / 1048576.0,
      static_cast<double>(bench::PeakRssBytes()) / (session_bytes + bench_bytes));
  const int64_t grown = bench::PeakRssBytes() - before_session;
  std::printf(
      "memory above the %.0f MiB the process held before the session: %.0f MiB, %.2f x what is "
      "held\n",
      before_session / 1048576.0, grown / 1048576.0,
      static_cast<double>(grown) / (session_bytes + bench_bytes));
  if (!absl::GetFlag(FLAGS_json).empty()) {
    const double n = std::max(measured, 1);
    const std::string json = absl::StrCat(
        "{\"params\": ", params.size(), ", \"numel\": ", numel, ", \"ranks\": ", kRanks,
        ", \"trainers\": ", kTrainers, ", \"optimizer\": \"", optimizer, "\"",
        ", \"owners\": ", owners ? "true" : "false",
        ", \"gradient_bytes_in\": ", numel * element_in * (replicated ? kTrainers : 1),
        ", \"parameter_bytes_out\": ", returned, ", \"measured_steps\": ", measured,
        ", \"wall_ms\": ", total_wall / n, ", \"ingest_ms\": ", total_phases[0] / n,
        ", \"step_ms\": ", total_phases[1] / n, ", \"all_gather_ms\": ", total_phases[2] / n,
        ", \"egress_ms\": ", total_phases[3] / n, ", \"egress_alone_ms\": ", total_phases[4] / n,
        ", \"peak_rss_bytes\": ", bench::PeakRssBytes(),
        ", \"before_session_bytes\": ", before_session, ", \"bench_bytes\": ", bench_bytes,
        ", \"ranks_held\": [", json_ranks, "]}\n");
    FILE* out = std::fopen(absl::GetFlag(FLAGS_json).c_str(), "w");
    if (out == nullptr || std::fputs(json.c_str(), out) < 0 || std::fclose(out) != 0) {
      std::fprintf(stderr, "cannot write %s\n", absl::GetFlag(FLAGS_json).c_str());
      return 1;
    }
  }
  saver.reset();
  for (bench::InProcessRank& rank : *ranks) rank.server->Shutdown(absl::Now() + absl::Seconds(1));
  return 0;
}

}  // namespace
}  // namespace optstep

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return optstep::Run();
}
