// More than a hundred kinds of bad input through a real server process (bad_input_cases.h):
// each answers its exact code with a message that names the field or value, leaves both of the
// rank's sessions bit for bit as they were (parameters, step counters, optimizer state), and the
// rank still serves; the server's resident memory grows by less than 64 MiB over the whole suite.

#include <grpcpp/create_channel.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optstep/v1/checkpoint_service.grpc.pb.h"
#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "tests/integration/test_session.h"
#include "tests/security/bad_input_cases.h"
#include "tests/testing/sanitizer.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::BadInput;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::StepSmall;
using ::optstep::testutil::Target;
using ::testing::HasSubstr;

#ifndef OPTSTEP_UNDER_SANITIZER
constexpr int64_t kRssGrowthBoundKb = 64 << 10;
#else
// AddressSanitizer keeps freed blocks in its quarantine (256 MiB by default) before reuse.
constexpr int64_t kRssGrowthBoundKb = (64 + 256) << 10;
#endif

// Everything a refused call could have changed in a session, as the server reports it.
struct Snapshot {
  uint64_t step = 0;
  uint64_t skipped_steps = 0;
  std::string parameters;  // every PullParameters chunk: param_id, offset and raw fp32 bytes
  std::string state;       // every ExportStateDict chunk: key, offset and raw bytes
  bool operator==(const Snapshot& o) const {
    return step == o.step && skipped_steps == o.skipped_steps && parameters == o.parameters &&
           state == o.state;
  }
};

Snapshot Take(const std::shared_ptr<grpc::Channel>& channel, const std::string& session_id) {
  Snapshot s;
  auto stub = v1::OptimizerService::NewStub(channel);
  {
    grpc::ClientContext context;
    v1::GetSessionRequest request;
    request.set_session_id(session_id);
    v1::SessionInfo info;
    EXPECT_TRUE(stub->GetSession(&context, request, &info).ok());
    s.step = info.step();
    s.skipped_steps = info.skipped_steps();
  }
  {
    grpc::ClientContext context;
    v1::PullParametersRequest request;
    request.set_session_id(session_id);
    auto reader = stub->PullParameters(&context, request);
    v1::PullParametersResponse response;
    while (reader->Read(&response)) {
      absl::StrAppend(&s.parameters, response.parameter().param_id(), "@",
                      response.parameter().offset(), ":", response.parameter().data(), ";");
    }
    EXPECT_TRUE(reader->Finish().ok());
  }
  auto checkpoints = v1::CheckpointService::NewStub(channel);
  grpc::ClientContext context;
  v1::ExportStateDictRequest request;
  request.set_session_id(session_id);
  auto reader = checkpoints->ExportStateDict(&context, request);
  v1::StateDictChunk chunk;
  while (reader->Read(&chunk)) {
    absl::StrAppend(&s.state, chunk.key(), "@", chunk.offset(), ":", chunk.data(), ";");
  }
  EXPECT_TRUE(reader->Finish().ok());
  return s;
}

// The `field` ("VmRSS", "VmSize") of /proc/<pid>/status in KiB.
int64_t StatusKb(pid_t pid, const std::string& field) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

int64_t RssKb(pid_t pid) { return StatusKb(pid, "VmRSS"); }

// SmallSpec(name) with initial values and `steps` steps applied; answers its id.
std::string Victim(Client& client, const std::string& name, int steps) {
  v1::SessionSpec spec = SmallSpec(name);
  spec.set_step_deadline_ms(600000);  // a contribution left pending is not aborted mid-suite
  auto info = client.CreateSession(spec);
  EXPECT_THAT(info.status(), IsOk());
  if (!info.ok()) return "";
  std::vector<float> w(32), b(8);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.03f * static_cast<float>(i) - 0.4f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = -0.05f * static_cast<float>(i);
  EXPECT_THAT(client.InitParameters(info->session_id(), 0, w), IsOk());
  EXPECT_THAT(client.InitParameters(info->session_id(), 1, b), IsOk());
  for (int s = 1; s <= steps; ++s) {
    EXPECT_THAT(StepSmall(client, info->session_id(), s).status(), IsOk());
  }
  return info->session_id();
}

std::vector<BadInput> AllCases() {
  std::vector<BadInput> all;
  for (auto group : {testutil::SessionSpecCases, testutil::HyperparameterCases,
                     testutil::ParameterStreamCases, testutil::CheckpointCases,
                     testutil::StepCases}) {  // Step last: its cases may leave a step pending
    for (BadInput& c : group()) all.push_back(std::move(c));
  }
  return all;
}

TEST(BadInputSuiteTest, EveryKindAnswersItsCodeAndChangesNothing) {
  Target target;
  target.checkpoint_root = absl::StrCat(getenv("TEST_TMPDIR"), "/checkpoints");
  ASSERT_EQ(mkdir(target.checkpoint_root.c_str(), 0755), 0);
  auto server = ServerProcess::Start({
      "--checkpoint_root=" + target.checkpoint_root,
      absl::StrCat("--max_params_per_session=", testutil::kMaxParamsPerSession),
      absl::StrCat("--max_session_bytes=", testutil::kMaxSessionBytes),
      absl::StrCat("--max_stream_bytes=", testutil::kMaxStreamBytes),
      absl::StrCat("--stream_idle_timeout_ms=", testutil::kStreamIdleTimeoutMs),
  });
  ASSERT_THAT(server.status(), IsOk());
  ClientOptions options;
  options.target = (*server)->address();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(options));
  ASSERT_THAT(testutil::WaitServing(*client), IsOk());
  target.channel = grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials());
  target.fresh = Victim(*client, "fresh", 0);
  target.stepped = Victim(*client, "stepped", 2);
  target.closable = Victim(*client, "closable", 0);
  ASSERT_FALSE(target.fresh.empty() || target.stepped.empty() || target.closable.empty());

  const std::vector<BadInput> cases = AllCases();
  std::set<std::string> kinds;
  for (const BadInput& c : cases) EXPECT_TRUE(kinds.insert(c.name).second) << c.name;
  EXPECT_GE(kinds.size(), 100u);
  RecordProperty("kinds", static_cast<int>(kinds.size()));

  const Snapshot fresh = Take(target.channel, target.fresh);
  const Snapshot stepped = Take(target.channel, target.stepped);
  ASSERT_EQ(stepped.step, 2u);
  ASSERT_FALSE(stepped.state.empty());
  const int64_t rss_before = RssKb((*server)->pid());
  for (const BadInput& c : cases) {
    SCOPED_TRACE(c.name);
    const grpc::Status status = c.call(target);
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.message));
    EXPECT_TRUE(Take(target.channel, target.fresh) == fresh);
    EXPECT_TRUE(Take(target.channel, target.stepped) == stepped);
    auto serving = client->CheckHealth();
    ASSERT_THAT(serving.status(), IsOk());
    ASSERT_TRUE(*serving) << "the rank stopped serving";
  }
  const int64_t rss_after = RssKb((*server)->pid());
  RecordProperty("rss_growth_kb", static_cast<int>(rss_after - rss_before));
  EXPECT_LT(rss_after - rss_before, kRssGrowthBoundKb)
      << "VmRSS " << rss_before << " kB before the suite, " << rss_after << " kB after";

  // Nothing was created; a new session still creates, steps and closes.
  auto sessions = client->ListSessions();
  ASSERT_THAT(sessions.status(), IsOk());
  EXPECT_EQ(sessions->size(), 2u);
  auto after = client->CreateSession(SmallSpec("after"));
  ASSERT_THAT(after.status(), IsOk());
  EXPECT_THAT(StepSmall(*client, after->session_id(), 1).status(), IsOk());
  EXPECT_THAT(client->CloseSession(after->session_id()), IsOk());
}

// One parameter "w" of `shape`, one trainer, with the optimizer `preset`.
v1::SessionSpec Huge(const std::string& name, std::vector<uint64_t> shape,
                     const std::string& preset) {
  v1::SessionSpec spec;
  spec.set_name(name);
  v1::ParameterSpec* w = spec.add_parameters();
  w->set_name("w");
  for (uint64_t d : shape) w->add_shape(d);
  spec.set_num_trainers(1);
  spec.set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
  spec.mutable_optimizer()->set_preset(preset);
  return spec;
}

// One CreateSession could kill a rank by allocating what it does not have. Here the rank's
// address space is bounded (as a pod's memory limit bounds it) to 2 GiB above what it maps at
// start, so allocating any of these sessions fails; each is refused before anything is
// allocated, naming its bytes and the budget, and the rank goes on serving.
TEST(BadInputSuiteTest, SessionsOverTheBudgetOfAnAddressSpaceBoundedRank) {
  auto server = ServerProcess::Start({"--memory_budget=1G"});
  ASSERT_THAT(server.status(), IsOk());
  const pid_t pid = (*server)->pid();
#ifndef OPTSTEP_UNDER_SANITIZER
  // Not under a sanitizer: its shadow memory and allocator reserve address space of their own.
  const rlim_t bound = static_cast<rlim_t>(StatusKb(pid, "VmSize") + (2 << 20)) << 10;
  const rlimit limit{bound, bound};
  ASSERT_EQ(prlimit(pid, RLIMIT_AS, &limit, nullptr), 0);
#endif
  ClientOptions options;
  options.target = (*server)->address();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(options));
  ASSERT_THAT(testutil::WaitServing(*client), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo tenant, client->CreateSession(SmallSpec("tenant")));
  const int64_t rss_before = RssKb(pid);
  for (const v1::SessionSpec& spec :
       {Huge("adam-1e9", {1000000000}, "adam"), Huge("muon-50k", {50000, 50000}, "muon"),
        Huge("soap-30k", {30000, 30000}, "soap"), Huge("sgd-1e10", {100000, 100000}, "sgd")}) {
    SCOPED_TRACE(spec.name());
    const absl::Status refused = client->CreateSession(spec).status();
    EXPECT_THAT(refused, testutil::StatusIs(absl::StatusCode::kResourceExhausted,
                                            absl::StrCat("session '", spec.name(), "' needs ")));
    EXPECT_THAT(refused.message(),
                HasSubstr("more than the rank's budget of 1073741824 bytes has free"));
    auto serving = client->CheckHealth();
    ASSERT_THAT(serving.status(), IsOk());
    ASSERT_TRUE(*serving);
  }
  EXPECT_LT(RssKb(pid) - rss_before, kRssGrowthBoundKb);
  EXPECT_THAT(StepSmall(*client, tenant.session_id(), 1).status(), IsOk());
  auto sessions = client->ListSessions();
  ASSERT_THAT(sessions.status(), IsOk());
  EXPECT_EQ(sessions->size(), 1u);
}

}  // namespace
}  // namespace optstep
