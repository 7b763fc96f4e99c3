// Recovery time of a healed rank (docs/deploy.md, "Rejoin"): a group of real server processes on
// loopback (--ranks, 3 by default; each rank a separate optstep_server) holds a session of the
// GPT-2-small layout (124M parameters, bench/gpt_layout.h); a trainer steps it, then one rank
// (--kill_rank: 1, or 0, which heals itself in) is SIGKILLed and started again at once on its
// port with its ordinal, as its supervisor does. It prints the time from the kill to the first
// step applied after it, and its phases:
//   detection kill -> a survivor NOT_SERVING (the heartbeats, or the new process's incarnation),
//   restart   kill -> the new process listens (process start, engine, server),
//   rejoin    listening -> every rank SERVING (rank 0 heals it: a new generation, the sessions
//             recreated, the communicators rebuilt, the masters and counters transferred),
//   resume    SERVING -> the trainer's next step applied (a whole step: gradients, update,
//             all-gather, parameters back).
// and, next to it, the wall of a step before the kill. The chain is Adam: the healed rank gets its
// moments from its buddy's copy (--state_redundancy=1), its masters from a peer.
// With --mid_step the rank dies inside the next step instead (it kills itself once the ranks
// stepped their own parameters, before the all-gather: --kill_before_allgather); the step is
// interrupted on the others, and the trainer's own recovery redoes it after the heal: "resume"
// then ends when that step is applied.
//
// With --stand_in_after_ms the rank does not come back at once: after that long its buddy
// stands in for it; the bench prints the stand-in's heal, the steps on the stand-in, and the
// rank's own process taking its place back when it is restarted after them. With
// --restart_while_stood_in=R as well, rank R (neither the lost rank nor its buddy) is SIGKILLed
// and restarted at once while the stand-in runs, and the bench prints its kill -> first applied
// step (with rank 0 stood in, R finds the group at the stand-in's store).
//
// With --killed_in_heal=rendezvous|transfer the restarted process dies in its heal first
// (--kill_during_heal) and is started again once more: the bench prints that lost heal (restart
// -> its death) beside the phases of the heal that follows.
//
//   bazel run //bench:recovery_bench -- --ranks=3 --layers=12 [--mid_step]
//       [--stand_in_after_ms=2000 [--restart_while_stood_in=2]] [--killed_in_heal=transfer]

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/gpt_layout.h"
#include "client/cpp/client.h"
#include "tests/testing/server_process.h"

ABSL_FLAG(int, ranks, 3, "Ranks of the group (each a server process).");
ABSL_FLAG(int, layers, 12, "Transformer layers of the model (12: 124M parameters).");
ABSL_FLAG(int, kill_rank, 1, "The rank killed and restarted (0: rank 0 heals itself in).");
ABSL_FLAG(int, steps_before, 2, "Steps before the kill (the first warms up).");
ABSL_FLAG(int64_t, peer_timeout_ms, 1000, "--peer_timeout_ms of the ranks.");
ABSL_FLAG(int64_t, stand_in_after_ms, 0,
          "0: the killed rank is restarted at once. Else it stays away: the ranks run with "
          "--rejoin_timeout_ms of this, the killed rank's buddy stands in for it (docs/deploy.md, "
          "\"A rank that does not return\"), and the rank is restarted after two steps on the "
          "stand-in, taking its place back.");
ABSL_FLAG(int, restart_while_stood_in, -1,
          "With --stand_in_after_ms: this rank (neither the lost rank nor its buddy) is "
          "SIGKILLed and restarted at once while the stand-in runs; -1: none.");
ABSL_FLAG(std::string, killed_in_heal, "",
          "'rendezvous' or 'transfer': the restarted rank dies there in its heal "
          "(--kill_during_heal) and is started again; empty: it heals at once.");
ABSL_FLAG(bool, mid_step, false,
          "Kill the rank inside the step after --steps_before (before its all-gather), not "
          "between steps.");

namespace optstep {
namespace {

using testutil::ServerProcess;
using Group = std::vector<std::unique_ptr<ServerProcess>>;

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

bool Serving(const ServerProcess& rank) {
  ClientOptions options;
  options.target = rank.address();
  auto client = Client::Connect(options);
  if (!client.ok()) return false;
  absl::StatusOr<bool> health = (*client)->CheckHealth();
  return health.ok() && *health;
}

v1::SessionSpec GptSpec(int layers, std::vector<int64_t>* sizes) {
  bench::GptShape shape;
  shape.layers = layers;
  std::vector<ParamInfo> params;
  for (int l = 0; l < layers; ++l) {
    for (ParamInfo& p : bench::GptLayer(shape, l)) params.push_back(std::move(p));
  }
  for (ParamInfo& p : bench::GptRest(shape)) params.push_back(std::move(p));
  v1::SessionSpec spec;
  spec.set_name("recovery");
  spec.set_num_trainers(1);
  spec.set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
  spec.mutable_optimizer()->set_preset("adam");
  for (const ParamInfo& p : params) {
    auto* param = spec.add_parameters();
    param->set_name(p.name);
    for (int64_t d : p.shape) param->add_shape(d);
    sizes->push_back(p.numel());
  }
  return spec;
}

int Run() {
  const int ranks = absl::GetFlag(FLAGS_ranks);
  const int dead = absl::GetFlag(FLAGS_kill_rank);
  if (ranks < 2 || dead < 0 || dead >= ranks) {
    std::fprintf(stderr, "--ranks must be at least 2 and --kill_rank in [0, %d)\n", ranks);
    return 1;
  }
  const int64_t stand_in_after_ms = absl::GetFlag(FLAGS_stand_in_after_ms);
  const int other = absl::GetFlag(FLAGS_restart_while_stood_in);
  if (other >= 0 &&
      (stand_in_after_ms <= 0 || other >= ranks || other == dead || other == (dead + 1) % ranks)) {
    std::fprintf(stderr,
                 "--restart_while_stood_in needs --stand_in_after_ms and a rank other than "
                 "--kill_rank and its buddy\n");
    return 1;
  }
  const std::vector<std::string> flags = {
      "--heartbeat_interval_ms=100",
      absl::StrCat("--peer_timeout_ms=", absl::GetFlag(FLAGS_peer_timeout_ms)),
      "--state_redundancy=1",
      absl::StrCat("--rejoin_timeout_ms=", stand_in_after_ms > 0 ? stand_in_after_ms : 300000),
      "--num_threads=2"};
  const bool mid_step = absl::GetFlag(FLAGS_mid_step);
  Group group;
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> rank_flags = flags;
    if (mid_step && r == dead) {
      rank_flags.push_back(
          absl::StrCat("--kill_before_allgather=", absl::GetFlag(FLAGS_steps_before) + 1));
    }
    rank_flags.push_back(absl::StrCat("--rank=", r));
    rank_flags.push_back(absl::StrCat("--world_size=", ranks));
    if (r > 0) rank_flags.push_back(absl::StrCat("--rendezvous=", group[0]->address()));
    absl::StatusOr<std::unique_ptr<ServerProcess>> started = ServerProcess::Start(rank_flags);
    if (!started.ok()) {
      std::fprintf(stderr, "cannot start rank %d: %s\n", r, started.status().ToString().c_str());
      return 1;
    }
    group.push_back(*std::move(started));
  }
  while (!Serving(*group[0])) absl::SleepFor(absl::Milliseconds(50));
  ClientOptions options;
  for (const auto& rank : group) options.rank_targets.push_back(rank->address());
  options.recovery_timeout = absl::Minutes(5);
  auto trainer = Client::Connect(options);
  std::vector<int64_t> sizes;
  absl::StatusOr<v1::SessionInfo> info =
      trainer.ok() ? (*trainer)->CreateSession(GptSpec(absl::GetFlag(FLAGS_layers), &sizes))
                   : absl::StatusOr<v1::SessionInfo>(trainer.status());
  if (!info.ok()) {
    std::fprintf(stderr, "cannot create the session: %s\n", info.status().ToString().c_str());
    return 1;
  }
  int64_t elements = 0;
  std::vector<std::vector<float>> values;
  std::vector<FullGradient> gradients;
  for (size_t p = 0; p < sizes.size(); ++p) {
    values.emplace_back(sizes[p], 1e-3f);
    elements += sizes[p];
  }
  for (size_t p = 0; p < sizes.size(); ++p) {
    gradients.push_back({static_cast<uint32_t>(p), values[p]});
  }
  uint64_t step = 0;
  const auto do_step = [&]() -> absl::Duration {
    StepOptions step_options;
    step_options.session_id = info->session_id();
    step_options.step = ++step;
    const absl::Time start = absl::Now();
    absl::StatusOr<StepReply> reply = (*trainer)->Step(step_options, gradients);
    if (!reply.ok()) {
      std::fprintf(stderr, "step %llu: %s\n", static_cast<unsigned long long>(step),
                   reply.status().ToString().c_str());
      std::exit(1);
    }
    return absl::Now() - start;
  };
  absl::Duration step_wall;
  for (int s = 0; s < absl::GetFlag(FLAGS_steps_before); ++s) step_wall = do_step();

  // Rank r started again on its port with its ordinal, as its supervisor does.
  const auto restart_flags = [&](int r) {
    const std::string& address = group[r]->address();
    std::vector<std::string> again = flags;
    again.push_back(absl::StrCat("--port=", address.substr(address.rfind(':') + 1)));
    again.push_back(absl::StrCat("--rank=", r));
    again.push_back(absl::StrCat("--world_size=", ranks));
    if (r > 0) again.push_back(absl::StrCat("--rendezvous=", group[0]->address()));
    return again;
  };
  const std::vector<std::string> restart = restart_flags(dead);
  // Mid-step: the step runs meanwhile, its trainer waiting through the heal.
  std::thread interrupted;
  absl::Time killed = absl::Now();
  // Detection: when a survivor stops serving (polled every 5 ms from the kill on).
  absl::Time detected_at;
  std::atomic<bool> abandoned{false};
  const ServerProcess& survivor = *group[(dead + 1) % ranks];
  std::thread detect([&] {
    while (!abandoned && Serving(survivor)) absl::SleepFor(absl::Milliseconds(5));
    detected_at = absl::Now();
  });
  // Before an early return: the threads end (a joinable one would terminate the bench), the
  // interrupted step once the group is stopped under it (do_step exits on its error).
  const auto abandon = [&] {
    abandoned = true;
    detect.join();
    group.clear();
    if (interrupted.joinable()) interrupted.join();
  };
  if (mid_step) {
    interrupted = std::thread(do_step);
    group[dead]->Wait();
    killed = absl::Now();  // within a few ms of its death (the waitpid wakes at once)
  } else {
    group[dead]->SignalAndWait(SIGKILL);
  }
  if (stand_in_after_ms > 0) {
    detect.join();
    const absl::Time detected = detected_at;
    for (int r = 0; r < ranks; ++r) {
      while (r != dead && !Serving(*group[r])) absl::SleepFor(absl::Milliseconds(20));
    }
    const absl::Time stood_in = absl::Now();
    if (mid_step) {
      interrupted.join();
    } else {
      do_step();
    }
    const absl::Time resumed = absl::Now();
    const absl::Duration on_stand_in = do_step();
    // Another rank lost meanwhile, and restarted at once.
    absl::Duration other_recovery;
    if (other >= 0) {
      const absl::Time other_killed = absl::Now();
      group[other]->SignalAndWait(SIGKILL);
      absl::StatusOr<std::unique_ptr<ServerProcess>> other_back =
          ServerProcess::Start(restart_flags(other));
      if (!other_back.ok()) {
        std::fprintf(stderr, "cannot restart rank %d: %s\n", other,
                     other_back.status().ToString().c_str());
        group.clear();
        return 1;
      }
      group[other] = *std::move(other_back);
      while (!Serving(*group[other])) absl::SleepFor(absl::Milliseconds(20));
      do_step();
      other_recovery = absl::Now() - other_killed;
    }
    // The rank's own process takes its place back.
    const absl::Time restarted = absl::Now();
    absl::StatusOr<std::unique_ptr<ServerProcess>> back = ServerProcess::Start(restart);
    if (!back.ok()) {
      std::fprintf(stderr, "cannot restart rank %d: %s\n", dead, back.status().ToString().c_str());
      group.clear();
      return 1;
    }
    group[dead] = *std::move(back);
    for (bool standing = true; standing; absl::SleepFor(absl::Milliseconds(20))) {
      absl::StatusOr<v1::SessionInfo> now = (*trainer)->GetSession(info->session_id());
      standing = !now.ok() || now->layout().stood_in_ranks_size() > 0;
    }
    for (const auto& rank : group) {
      while (!Serving(*rank)) absl::SleepFor(absl::Milliseconds(20));
    }
    const absl::Time healed_back = absl::Now();
    const absl::Duration after = do_step();
    std::printf(
        "recovery: %d ranks, %.1fM parameters (%zu tensors), Adam; rank %d SIGKILLed %s, "
        "stood in for by rank %d after --rejoin_timeout_ms=%lld\n",
        ranks, elements / 1e6, sizes.size(), dead,
        mid_step ? "in a step, before its all-gather" : "between steps", (dead + 1) % ranks,
        static_cast<long long>(stand_in_after_ms));
    std::printf("  step wall before the kill  %8.3f s\n", Seconds(step_wall));
    std::printf("  detection (kill -> a survivor NOT_SERVING) %7.3f s\n",
                Seconds(detected - killed));
    std::printf("  stand-in (-> every survivor SERVING; the wait included) %7.3f s\n",
                Seconds(stood_in - detected));
    std::printf("  - of which the stand-in's start and heal (the wait taken off) %7.3f s\n",
                Seconds(stood_in - detected - absl::Milliseconds(stand_in_after_ms)));
    std::printf("  resume (-> %s step applied on the stand-in) %7.3f s\n",
                mid_step ? "the interrupted" : "next", Seconds(resumed - stood_in));
    std::printf("  kill -> first applied step  %7.3f s\n", Seconds(resumed - killed));
    std::printf("  step wall on the stand-in  %8.3f s\n", Seconds(on_stand_in));
    if (other >= 0) {
      std::printf("  rank %d killed and restarted meanwhile: kill -> first applied step %7.3f s\n",
                  other, Seconds(other_recovery));
    }
    std::printf("  back (restart -> the rank's own process in place, every rank SERVING) %7.3f s\n",
                Seconds(healed_back - restarted));
    std::printf("  step wall after it is back  %8.3f s\n", Seconds(after));
    return 0;
  }
  // A restarted process lost in its heal first, when asked for.
  const std::string killed_in_heal = absl::GetFlag(FLAGS_killed_in_heal);
  absl::Duration lost_heal;
  if (!killed_in_heal.empty()) {
    const absl::Time started = absl::Now();
    std::vector<std::string> dying = restart;
    dying.push_back(absl::StrCat("--kill_during_heal=", killed_in_heal));
    absl::StatusOr<std::unique_ptr<ServerProcess>> doomed = ServerProcess::Start(dying);
    if (!doomed.ok() || (*doomed)->WaitFor(absl::Seconds(300)) == -1) {
      std::fprintf(stderr, "rank %d's first restart did not die in its heal\n", dead);
      abandon();
      return 1;
    }
    lost_heal = absl::Now() - started;
  }
  absl::StatusOr<std::unique_ptr<ServerProcess>> again = ServerProcess::Start(restart);
  if (!again.ok()) {
    std::fprintf(stderr, "cannot restart rank %d: %s\n", dead, again.status().ToString().c_str());
    abandon();
    return 1;
  }
  group[dead] = *std::move(again);
  const absl::Time listening = absl::Now();
  for (const auto& rank : group) {
    while (!Serving(*rank)) absl::SleepFor(absl::Milliseconds(20));
  }
  const absl::Time serving = absl::Now();
  if (mid_step) {
    interrupted.join();
  } else {
    do_step();
  }
  const absl::Time applied = absl::Now();
  detect.join();
  std::printf(
      "recovery: %d ranks, %.1fM parameters (%zu tensors), Adam; rank %d SIGKILLed %s "
      "and restarted at once\n",
      ranks, elements / 1e6, sizes.size(), dead,
      mid_step ? "in a step, before its all-gather" : "between steps");
  std::printf("  step wall before the kill  %8.3f s\n", Seconds(step_wall));
  std::printf("  detection (kill -> a survivor NOT_SERVING) %7.3f s\n",
              Seconds(detected_at - killed));
  if (!killed_in_heal.empty()) {
    std::printf("  a heal lost (restart -> the restarted process killed at its %s) %7.3f s\n",
                killed_in_heal.c_str(), Seconds(lost_heal));
  }
  std::printf("  restart (kill -> listening) %7.3f s\n", Seconds(listening - killed));
  std::printf("  rejoin (-> every rank SERVING: rebuild + state transfer) %7.3f s\n",
              Seconds(serving - listening));
  std::printf("  resume (-> %s step applied) %7.3f s\n", mid_step ? "the interrupted" : "next",
              Seconds(applied - serving));
  std::printf("  kill -> first applied step  %7.3f s\n", Seconds(applied - killed));
  return 0;
}

}  // namespace
}  // namespace optstep

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return optstep::Run();
}
