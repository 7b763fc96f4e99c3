// Checkpoints and state dicts across ranks (real server processes on loopback, Gloo between
// them): Save on one world size and Load on others continues bit for bit; state dicts round
// trip across ranks and per sub-optimizer; damaged checkpoints are refused with the state
// unchanged; a save while a trainer steps captures one step; a rank killed during a save leaves
// the previous checkpoint loadable.

#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/auto_checkpoint_run.h"
#include "tests/integration/test_session.h"
#include "tests/testing/directory_listing.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

namespace fs = std::filesystem;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::StartGroup;
using ::optstep::testutil::StatusIs;

using Group = std::vector<std::unique_ptr<ServerProcess>>;

// Chunk 0: a matrix and its bias; chunk 1: matrices only. With the Muon chain the AdamW
// sub-optimizer (vectors) covers chunk 0 only, Muon covers both (the MoE-like layout).
struct ParamDef {
  const char* name;
  std::vector<uint64_t> shape;
  uint32_t chunk;
};
const std::vector<ParamDef> kParams = {{"layers.0.weight", {24, 16}, 0},
                                       {"layers.0.bias", {24}, 0},
                                       {"layers.1.weight", {16, 40}, 1},
                                       {"layers.2.weight", {40, 24}, 1},
                                       {"layers.2.w2", {7, 3}, 1}};

uint64_t Numel(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

float GradientValue(int step, int param, uint64_t i) {
  const uint64_t h =
      (uint64_t(step) * 1000003u + uint64_t(param) * 104729u + i * 2654435761u) % 1000u;
  return (static_cast<float>(h) - 500.0f) / 997.0f;
}

v1::SessionSpec Spec(const std::string& optimizer) {
  v1::SessionSpec spec;
  for (const ParamDef& p : kParams) {
    v1::ParameterSpec* param = spec.add_parameters();
    param->set_name(p.name);
    for (uint64_t d : p.shape) param->add_shape(d);
    param->set_model_chunk(p.chunk);
  }
  spec.set_num_trainers(1);
  spec.set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
  spec.set_step_deadline_ms(30000);
  spec.mutable_optimizer()->set_preset(optimizer);
  return spec;
}

// A temporary checkpoint root, removed at the end.
class TempDir : public testutil::ScopedTempDir {
 public:
  TempDir() : ScopedTempDir("optstep-ckpt") {}
};

// A running group with a client and one session.
struct Running {
  Group group;
  std::unique_ptr<Client> client;
  std::string session;
};

absl::StatusOr<Running> Start(int world, const std::string& root, const std::string& optimizer,
                              bool init = true, std::vector<std::string> args = {}) {
  if (!root.empty()) args.push_back("--checkpoint_root=" + root);
  OPTSTEP_ASSIGN_OR_RETURN(testutil::Running started, testutil::StartRunning(world, args));
  Running run;
  run.group = std::move(started.group);
  run.client = std::move(started.client);
  OPTSTEP_ASSIGN_OR_RETURN(v1::SessionInfo info, run.client->CreateSession(Spec(optimizer)));
  run.session = info.session_id();
  for (uint32_t p = 0; p < kParams.size() && init; ++p) {
    std::vector<float> values(Numel(kParams[p].shape));
    for (uint64_t i = 0; i < values.size(); ++i)
      values[i] = 0.01f * static_cast<float>((i * 7 + p) % 13);
    OPTSTEP_RETURN_IF_ERROR(run.client->InitParameters(run.session, p, values));
  }
  return run;
}

absl::StatusOr<StepReply> Step(Running& run, int step) {
  std::vector<std::vector<float>> grads(kParams.size());
  std::vector<FullGradient> full;
  for (uint32_t p = 0; p < kParams.size(); ++p) {
    for (uint64_t i = 0; i < Numel(kParams[p].shape); ++i)
      grads[p].push_back(GradientValue(step, p, i));
    full.push_back({p, grads[p]});
  }
  StepOptions options;
  options.session_id = run.session;
  options.step = step;
  return run.client->Step(options, full);
}

absl::StatusOr<std::string> Pulled(Running& run) {
  return testutil::Pulled(*run.client, run.session);
}

// key -> bytes of the merged state dict.
absl::StatusOr<std::map<std::string, std::string>> Exported(Running& run) {
  return testutil::ExportedState(*run.client, run.session);
}

class SaveLoadTest : public ::testing::TestWithParam<const char*> {};

TEST_P(SaveLoadTest, SavedOnTwoRanksLoadedOnOneAndThreeContinuesBitForBit) {
  const std::string optimizer = GetParam();
  TempDir root;
  std::string reference_params;
  std::map<std::string, std::string> reference_state;
  {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Running ref, Start(1, "", optimizer));
    for (int step = 1; step <= 5; ++step) ASSERT_THAT(Step(ref, step).status(), IsOk());
    OPTSTEP_ASSERT_OK_AND_ASSIGN(reference_params, Pulled(ref));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(reference_state, Exported(ref));
  }
  std::string at_save;
  {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Running two, Start(2, root.path(), optimizer));
    for (int step = 1; step <= 3; ++step) ASSERT_THAT(Step(two, step).status(), IsOk());
    std::vector<v1::CheckpointProgress> reports;
    auto saved = two.client->Save(two.session, "ck",
                                  [&](const v1::CheckpointProgress& p) { reports.push_back(p); });
    ASSERT_THAT(saved.status(), IsOk());
    EXPECT_EQ(saved->step(), 3u);
    EXPECT_FALSE(reports.empty());
    EXPECT_TRUE(fs::exists(fs::path(root.path()) / "ck" / "shard-1-of-2.safetensors"));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(at_save, Pulled(two));
  }
  for (int world : {1, 3}) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run, Start(world, root.path(), optimizer, /*init=*/false));
    auto loaded = run.client->Load(run.session, "ck");
    ASSERT_THAT(loaded.status(), IsOk()) << "world " << world;
    EXPECT_EQ(loaded->step(), 3u);
    // Re-gathered: the loaded parameters are what every rank serves now.
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string params, Pulled(run));
    EXPECT_TRUE(params == at_save) << "world " << world;
    for (int step = 4; step <= 5; ++step) ASSERT_THAT(Step(run, step).status(), IsOk());
    OPTSTEP_ASSERT_OK_AND_ASSIGN(params, Pulled(run));
    EXPECT_TRUE(params == reference_params) << "world " << world << " diverged after the load";
    OPTSTEP_ASSERT_OK_AND_ASSIGN(auto state, Exported(run));
    EXPECT_EQ(state.size(), reference_state.size());
    for (const auto& [key, bytes] : reference_state) {
      EXPECT_TRUE(state[key] == bytes) << "world " << world << ": " << key;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Chains, SaveLoadTest, ::testing::Values("muon", "soap"));

TEST(StateDictTest, ExportImportAcrossRanksMergedAndPerSubOptimizer) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running one, Start(1, "", "muon"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running two, Start(2, "", "muon"));
  for (int step = 1; step <= 2; ++step) {
    ASSERT_THAT(Step(one, step).status(), IsOk());
    ASSERT_THAT(Step(two, step).status(), IsOk());
  }
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto merged_one, Exported(one));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto merged_two, Exported(two));
  EXPECT_TRUE(merged_one == merged_two);  // gathered from both ranks, the same as one rank

  // Per sub-optimizer: AdamW (vectors) covers chunk 0 only, Muon covers chunks 0 and 1.
  v1::ExportStateDictRequest request;
  request.set_session_id(two.session);
  request.set_layout(v1::STATE_DICT_LAYOUT_BY_SUB_OPTIMIZER);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto per_sub, two.client->ExportStateDict(request));
  std::map<std::string, std::set<std::string>> chunks;
  for (const auto& e : per_sub) chunks[e.sub_optimizer].insert(e.chunk_key);
  ASSERT_EQ(chunks.size(), 2u);
  for (const auto& [sub, keys] : chunks) {
    if (sub.find("adam") != std::string::npos) {
      EXPECT_THAT(keys, ::testing::ElementsAre("model0")) << sub;
    } else {
      EXPECT_THAT(keys, ::testing::ElementsAre("model0", "model1")) << sub;
    }
  }
  // Import the per-sub-optimizer dict into a fresh group of three ranks: the same state.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running three, Start(3, "", "muon", /*init=*/false));
  ASSERT_THAT(three.client->ImportStateDict(three.session, per_sub), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto merged_three, Exported(three));
  EXPECT_TRUE(merged_three == merged_one);
  ASSERT_THAT(Step(three, 3).status(), IsOk());
  ASSERT_THAT(Step(one, 3).status(), IsOk());
  EXPECT_TRUE(*Pulled(three) == *Pulled(one));

  // A part for one rank only (the other ranks stage nothing): the key's owner takes it.
  std::vector<Client::StateDictEntry> one_key;
  for (const auto& e : per_sub) {
    if (e.key.find("/layers.2.weight/") != std::string::npos && one_key.empty()) {
      one_key.push_back(e);
      one_key.back().sub_optimizer.clear();
      one_key.back().chunk_key.clear();
      std::fill(one_key.back().bytes.begin(), one_key.back().bytes.end(), '\0');
    }
  }
  ASSERT_EQ(one_key.size(), 1u);
  ASSERT_THAT(three.client->ImportStateDict(three.session, one_key), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto replaced, Exported(three));
  EXPECT_TRUE(replaced[one_key[0].key] == one_key[0].bytes);
  // Back to the exported state (step 2), and step 3 again: the same as on one rank.
  ASSERT_THAT(three.client->ImportStateDict(three.session, per_sub), IsOk());
  ASSERT_THAT(Step(three, 3).status(), IsOk());
  EXPECT_TRUE(*Pulled(three) == *Pulled(one));

  // A bad key changes nothing on any rank.
  std::vector<Client::StateDictEntry> bad = {per_sub.front()};
  bad[0].key = "state/muon/layers.9.weight/momentum_buffer";
  EXPECT_THAT(three.client->ImportStateDict(three.session, bad),
              StatusIs(absl::StatusCode::kInvalidArgument, "layers.9.weight"));
  EXPECT_TRUE(*Pulled(three) == *Pulled(one));
}

void CopyTree(const fs::path& from, const fs::path& to) {
  fs::copy(from, to, fs::copy_options::recursive);
}

TEST(StateDictTest, PerModelChunkExportAndImportAcrossRanks) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running two, Start(2, "", "muon"));
  for (int step = 1; step <= 2; ++step) ASSERT_THAT(Step(two, step).status(), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto merged, Exported(two));

  // Keyed by model chunk: each parameter's tensors sit under the chunk it was declared in.
  v1::ExportStateDictRequest request;
  request.set_session_id(two.session);
  request.set_layout(v1::STATE_DICT_LAYOUT_BY_MODEL_CHUNK);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto by_chunk, two.client->ExportStateDict(request));
  std::map<std::string, std::string> chunk_of_key;
  for (const auto& e : by_chunk) {
    EXPECT_TRUE(e.sub_optimizer.empty()) << e.key;
    if (absl::StartsWith(e.key, "param/")) chunk_of_key[e.key] = e.chunk_key;
  }
  for (const ParamDef& p : kParams) {
    EXPECT_EQ(chunk_of_key[absl::StrCat("param/", p.name)], absl::StrCat("model", p.chunk))
        << p.name;
  }

  // Only chunk 1: no tensor of a chunk-0 parameter, every tensor of the chunk-1 ones.
  request.add_model_chunks(1);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto only_one, two.client->ExportStateDict(request));
  std::set<std::string> keys;
  for (const auto& e : only_one) {
    EXPECT_EQ(e.chunk_key, "model1") << e.key;
    EXPECT_EQ(e.key.find("layers.0."), std::string::npos) << e.key;
    keys.insert(e.key);
  }
  for (const auto& [key, bytes] : merged) {
    if (key.find("layers.1.") != std::string::npos || key.find("layers.2.") != std::string::npos) {
      EXPECT_EQ(keys.count(key), 1u) << key;
    }
  }

  // The whole chunk-keyed dict imported into three fresh ranks is the same state.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running three, Start(3, "", "muon", /*init=*/false));
  ASSERT_THAT(three.client->ImportStateDict(three.session, by_chunk), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto merged_three, Exported(three));
  EXPECT_TRUE(merged_three == merged);
  ASSERT_THAT(Step(three, 3).status(), IsOk());
  ASSERT_THAT(Step(two, 3).status(), IsOk());
  EXPECT_TRUE(*Pulled(three) == *Pulled(two));
}

// Two sessions of one definition (two tenants training the same model) under
// --keep_checkpoints=1: each save prunes its own session's older checkpoint, never the other's.
TEST(CheckpointPruningTest, ASaveKeepsTheNewestOfItsOwnSessionOnly) {
  TempDir root;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      Running run, Start(2, root.path(), "adam", /*init=*/true, {"--keep_checkpoints=1"}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo other, run.client->CreateSession(Spec("adam")));
  ASSERT_NE(other.session_id(), run.session);
  ASSERT_THAT(run.client->Save(run.session, "a1").status(), IsOk());
  ASSERT_THAT(run.client->Save(other.session_id(), "b1").status(), IsOk());
  ASSERT_THAT(Step(run, 1).status(), IsOk());
  ASSERT_THAT(run.client->Save(run.session, "a2").status(), IsOk());
  EXPECT_FALSE(fs::exists(fs::path(root.path()) / "a1"));
  EXPECT_TRUE(fs::exists(fs::path(root.path()) / "a2"));
  EXPECT_TRUE(fs::exists(fs::path(root.path()) / "b1")) << "another session's checkpoint went";
  ASSERT_THAT(run.client->Save(other.session_id(), "b2").status(), IsOk());
  EXPECT_FALSE(fs::exists(fs::path(root.path()) / "b1"));
  EXPECT_TRUE(fs::exists(fs::path(root.path()) / "a2")) << "another session's checkpoint went";
}

TEST(CheckpointCorruptionTest, DamagedCheckpointsAreRefusedAndTheStateIsUnchanged) {
  TempDir root;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run, Start(2, root.path(), "muon"));
  ASSERT_THAT(Step(run, 1).status(), IsOk());
  ASSERT_THAT(run.client->Save(run.session, "good").status(), IsOk());
  ASSERT_THAT(Step(run, 2).status(), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(const std::string before, Pulled(run));
  const fs::path good = fs::path(root.path()) / "good";
  const fs::path shard = "shard-1-of-2.safetensors";

  CopyTree(good, fs::path(root.path()) / "truncated");
  fs::resize_file(fs::path(root.path()) / "truncated" / shard, fs::file_size(good / shard) - 4);
  CopyTree(good, fs::path(root.path()) / "flipped");
  {
    std::fstream f(fs::path(root.path()) / "flipped" / shard,
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    char c = 0;
    f.seekg(-3, std::ios::end);
    f.get(c);
    f.seekp(-3, std::ios::end);
    f.put(static_cast<char>(c ^ 0x10));
  }
  CopyTree(good, fs::path(root.path()) / "missing");
  fs::remove(fs::path(root.path()) / "missing" / shard);
  CopyTree(good, fs::path(root.path()) / "version");
  {
    const fs::path manifest = fs::path(root.path()) / "version" / "manifest.json";
    std::ifstream in(manifest);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find("\"format_version\": 1");
    ASSERT_NE(at, std::string::npos) << text.substr(0, 200);
    text.replace(at, 19, "\"format_version\": 7");
    std::ofstream(manifest) << text;
  }
  struct Case {
    const char* name;
    absl::StatusCode code;
    const char* message;
  };
  for (const Case& c : {Case{"truncated", absl::StatusCode::kDataLoss, "shard-1-of-2"},
                        Case{"flipped", absl::StatusCode::kDataLoss, "shard-1-of-2"},
                        Case{"missing", absl::StatusCode::kDataLoss, "shard-1-of-2"},
                        Case{"version", absl::StatusCode::kFailedPrecondition, "7"},
                        Case{"../escape", absl::StatusCode::kInvalidArgument, "escape"},
                        Case{"nonexistent", absl::StatusCode::kNotFound, "nonexistent"}}) {
    EXPECT_THAT(run.client->Load(run.session, c.name).status(), StatusIs(c.code, c.message))
        << c.name;
    EXPECT_TRUE(*Pulled(run) == before) << c.name;
  }
  // Another definition: refused by digest.
  v1::SessionSpec other = Spec("adam");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo adam, run.client->CreateSession(other));
  EXPECT_THAT(run.client->Load(adam.session_id(), "good").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "another session definition"));
  EXPECT_THAT(run.client->Save(run.session, "good").status(),
              StatusIs(absl::StatusCode::kAlreadyExists));
  // The session keeps stepping, and the good checkpoint still loads.
  ASSERT_THAT(Step(run, 3).status(), IsOk());
  auto loaded = run.client->Load(run.session, "good");
  ASSERT_THAT(loaded.status(), IsOk());
  EXPECT_EQ(loaded->step(), 1u);
  ASSERT_THAT(Step(run, 2).status(), IsOk());
  EXPECT_TRUE(*Pulled(run) == before);

  // Without a checkpoint root.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running bare, Start(1, "", "muon"));
  EXPECT_THAT(bare.client->Save(bare.session, "x").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "--checkpoint_root"));
}

TEST(CheckpointConsistencyTest, SaveWhileATrainerStepsCapturesOneStep) {
  TempDir root;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run, Start(2, root.path(), "muon"));
  absl::Mutex mu;
  std::map<uint64_t, std::string> params_of_step;  // what the trainer received
  std::atomic<bool> stop{false};
  std::thread trainer([&] {
    for (int step = 1; !stop && step <= 400; ++step) {
      auto reply = Step(run, step);
      if (!reply.ok()) break;
      absl::MutexLock lock(&mu);
      params_of_step[reply->step] = testutil::FlatParams(reply->params);
    }
  });
  absl::SleepFor(absl::Milliseconds(300));
  auto saved = run.client->Save(run.session, "live");
  stop = true;
  trainer.join();
  ASSERT_THAT(saved.status(), IsOk());
  ASSERT_GT(saved->step(), 0u);
  std::string expected;
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(params_of_step.count(saved->step()), 1u);
    expected = params_of_step[saved->step()];
  }
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running fresh, Start(1, root.path(), "muon", /*init=*/false));
  auto loaded = fresh.client->Load(fresh.session, "live");
  ASSERT_THAT(loaded.status(), IsOk());
  EXPECT_EQ(loaded->step(), saved->step());
  EXPECT_TRUE(*Pulled(fresh) == expected);
}

TEST(CheckpointCrashTest, ARankKilledDuringASaveLeavesThePreviousCheckpointLoadable) {
  TempDir root;
  const fs::path second = fs::path(root.path()) / "second";
  const fs::path second_tmp = fs::path(root.path()) / ".second.tmp";
  std::string at_first;
  bool killed_mid_save = false;
  {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Running run, Start(2, root.path(), "soap"));
    ASSERT_THAT(Step(run, 1).status(), IsOk());
    ASSERT_THAT(run.client->Save(run.session, "first").status(), IsOk());
    OPTSTEP_ASSERT_OK_AND_ASSIGN(at_first, Pulled(run));
    ASSERT_THAT(Step(run, 2).status(), IsOk());
    std::atomic<bool> done{false};
    std::thread saver([&] {
      (void)run.client->Save(run.session, "second");
      done = true;
    });
    // Kill rank 0, which writes the manifest and renames, as soon as the save has begun
    // writing; then rank 1.
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (!done && !fs::exists(second_tmp) && absl::Now() < give_up) {
    }
    killed_mid_save = !fs::exists(second);
    ::kill(run.group[0]->pid(), SIGKILL);
    ::kill(run.group[1]->pid(), SIGKILL);
    saver.join();
  }
  RecordProperty("killed_mid_save", killed_mid_save ? "yes" : "no");
  // "second" is complete and loadable, or absent with at most the hidden temporary directory
  // left; never a visible, partial directory.
  const bool second_complete = fs::exists(second);
  if (second_complete) {
    EXPECT_TRUE(fs::exists(second / "manifest.json"));
  }
  if (killed_mid_save && !second_complete) {
    EXPECT_TRUE(fs::exists(second_tmp));
  }

  OPTSTEP_ASSERT_OK_AND_ASSIGN(Running fresh, Start(1, root.path(), "soap", /*init=*/false));
  if (!second_complete) {
    EXPECT_THAT(fresh.client->Load(fresh.session, "second").status(),
                StatusIs(absl::StatusCode::kNotFound, "second"));
  }
  auto loaded = fresh.client->Load(fresh.session, "first");
  ASSERT_THAT(loaded.status(), IsOk());
  EXPECT_EQ(loaded->step(), 1u);
  EXPECT_TRUE(*Pulled(fresh) == at_first);
  // The next save of the same name replaces what the killed one left behind.
  if (!second_complete) {
    ASSERT_THAT(fresh.client->Save(fresh.session, "second").status(), IsOk());
    EXPECT_FALSE(fs::exists(second_tmp));
    auto reloaded = fresh.client->Load(fresh.session, "second");
    ASSERT_THAT(reloaded.status(), IsOk());
    EXPECT_EQ(reloaded->step(), 1u);
  }
}

}  // namespace
}  // namespace optstep
