// Checkpoint save / load throughput of an AdamW state (master + exp_avg + exp_avg_sq, fp32, per
// parameter) with GPT-like shapes: hidden 2048, 16 heads, FFN 8192, vocabulary 50257, 2048
// positions; 24 layers make the 1.3B-parameter model (15.8 GB of state). --layers scales it
// (the state is held in memory; pick what the machine holds next to the page cache), or
// --hold_state=false lets every tensor share one buffer of the largest tensor's size, so that
// the full model runs in little memory: the same bytes cross the same calls, the contents are
// not the model's.
//
// Reference, measured in the same run on the same file system: the same bytes written
// sequentially to one file (one write() per tensor straight from its memory, then fsync) and
// read back (one pread per tensor into the same buffers): plain POSIX at its fastest here, as
// large requests beat 16 MiB ones on this machine's virtual disk. Between the write and the read
// phases every file's pages are dropped from the page cache (posix_fadvise DONTNEED after fsync),
// so reads come from the device.
//
//   bazel run -c opt //bench:checkpoint_bench -- --layers=12 --dir=/var/tmp

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "bench/gpt_layout.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/partition.h"

ABSL_FLAG(int, layers, 24, "Transformer layers (24: the 1.3B-parameter model, 15.8 GB).");
ABSL_FLAG(std::string, dir, "/tmp", "Directory for the files (removed afterwards).");
ABSL_FLAG(int, ranks, 1, "Shards written (and read) concurrently, one thread each.");
ABSL_FLAG(int, staging_mib, 16, "Staging buffer of the writer / reader, MiB.");
ABSL_FLAG(int, repeats, 2,
          "Rounds of (raw write, save, raw read, load, verify); each phase's best is reported.");
ABSL_FLAG(bool, hold_state, true,
          "Hold every tensor in memory; false: all tensors share one buffer (full scale in "
          "little memory).");
ABSL_FLAG(bool, callbacks, false,
          "Save through reader callbacks (a memcpy per piece, as a device copy) instead of host "
          "pointers.");

namespace optstep {
namespace bench {
namespace {

#define BENCH_CHECK_OK(expr)                                               \
  do {                                                                     \
    const absl::Status status_ = (expr);                                   \
    if (!status_.ok()) {                                                   \
      std::fprintf(stderr, "%s: %s\n", #expr, status_.ToString().c_str()); \
      std::exit(1);                                                        \
    }                                                                      \
  } while (0)

struct State {
  std::vector<std::string> keys;
  std::vector<Shape> shapes;
  std::vector<int> param_of;    // index into params
  std::vector<Buffer> storage;  // one per tensor, or one shared by all
  std::vector<float*> buffers;  // tensor i's memory
  uint64_t held = 0;
  std::vector<int64_t> numel;
  uint64_t bytes = 0;
};

State MakeState(const std::vector<ParamInfo>& params, bool hold) {
  State s;
  for (size_t p = 0; p < params.size(); ++p) {
    for (int k = 0; k < 3; ++k) {  // master, exp_avg, exp_avg_sq
      s.param_of.push_back(static_cast<int>(p));
      s.shapes.push_back(params[p].shape);
      s.numel.push_back(params[p].numel());
    }
    s.keys.push_back("param/" + params[p].name);
    s.keys.push_back("state/adamw/" + params[p].name + "/exp_avg");
    s.keys.push_back("state/adamw/" + params[p].name + "/exp_avg_sq");
  }
  int64_t largest = 0;
  for (int64_t n : s.numel) largest = std::max(largest, n);
  for (size_t i = 0; i < s.keys.size(); ++i) {
    if (hold || s.storage.empty()) {
      const int64_t n = hold ? s.numel[i] : largest;
      s.storage.push_back(AllocateFirstTouch(n, 0.001f * static_cast<float>(i % 997)));
      s.held += static_cast<uint64_t>(n) * sizeof(float);
    }
    s.buffers.push_back(s.storage.back().get());
    s.bytes += static_cast<uint64_t>(s.numel[i]) * sizeof(float);
  }
  return s;
}

// Runs fn(rank) for every rank on its own thread, as the ranks of a server group would.
void OnEveryRank(int ranks, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

void DropCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

double RawWrite(const State& s, const std::string& path) {
  const auto start = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (size_t i = 0; i < s.buffers.size(); ++i) {
    const char* p = reinterpret_cast<const char*>(s.buffers[i]);
    uint64_t left = static_cast<uint64_t>(s.numel[i]) * sizeof(float);
    while (left > 0) {
      const ssize_t w = ::write(fd, p, left);
      if (w <= 0) std::exit(2);
      p += w;
      left -= static_cast<uint64_t>(w);
    }
  }
  ::fsync(fd);
  ::close(fd);
  return Seconds(start, Clock::now());
}

double RawRead(State& s, const std::string& path) {
  const auto start = Clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  uint64_t offset = 0;
  for (size_t i = 0; i < s.buffers.size(); ++i) {
    char* p = reinterpret_cast<char*>(s.buffers[i]);
    uint64_t left = static_cast<uint64_t>(s.numel[i]) * sizeof(float);
    while (left > 0) {
      const ssize_t r = ::pread(fd, p, left, offset);
      if (r <= 0) std::exit(3);
      p += r;
      offset += static_cast<uint64_t>(r);
      left -= static_cast<uint64_t>(r);
    }
  }
  ::close(fd);
  return Seconds(start, Clock::now());
}

double Save(const State& s, const std::vector<int>& owner, const std::string& dir, int ranks,
            const CheckpointIoOptions& io, bool callbacks) {
  const auto start = Clock::now();
  const uint64_t save = NewCheckpointSave();
  BENCH_CHECK_OK(PrepareCheckpoint(dir, "bench", save));
  Manifest manifest;
  manifest.world_size = ranks;
  manifest.shards.resize(ranks);
  OnEveryRank(ranks, [&](int r) {
    std::vector<TensorSource> sources;
    for (size_t i = 0; i < s.keys.size(); ++i) {
      if (owner[s.param_of[i]] != r) continue;
      TensorSource t{s.keys[i], StateTensor::Type::kF32, s.shapes[i]};
      const char* base = reinterpret_cast<const char*>(s.buffers[i]);
      if (callbacks) {
        t.read = [base](uint64_t offset, size_t n, void* dst) {
          std::memcpy(dst, base + offset, n);
          return absl::OkStatus();
        };
      } else {
        t.data = base;
      }
      sources.push_back(std::move(t));
    }
    absl::StatusOr<ShardFile> file =
        WriteCheckpointShard(dir, "bench", save, r, ranks, sources, nullptr, io);
    BENCH_CHECK_OK(file.status());
    manifest.shards[r] = {file->file, file->bytes, file->crc32c};
  });
  BENCH_CHECK_OK(CommitCheckpoint(dir, "bench", save, manifest, 0));
  return Seconds(start, Clock::now());
}

double Load(State& s, const std::string& dir, int ranks, const CheckpointIoOptions& io) {
  const auto start = Clock::now();
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(dir, "bench", io);
  BENCH_CHECK_OK(reader.status());
  OnEveryRank(ranks, [&](int r) {
    for (size_t i = 0; i < s.keys.size(); ++i) {
      const CheckpointTensor* t = (*reader)->Find(s.keys[i]);
      if (t == nullptr || t->shard != r) continue;
      BENCH_CHECK_OK((*reader)->Read(*t, s.buffers[i]));
    }
  });
  return Seconds(start, Clock::now());
}

// The one-pass load: ReadShard delivers every tensor and checks the CRC on the way.
double LoadVerified(State& s, const std::string& dir, int ranks, const CheckpointIoOptions& io) {
  const auto start = Clock::now();
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(dir, "bench", io);
  BENCH_CHECK_OK(reader.status());
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < s.keys.size(); ++i) index[s.keys[i]] = i;
  OnEveryRank(ranks, [&](int r) {
    BENCH_CHECK_OK((*reader)->ReadShard(
        r, [&](const CheckpointTensor& t, uint64_t offset, size_t n, const void* src) {
          char* dst = reinterpret_cast<char*>(s.buffers[index.at(t.key)]);
          std::memcpy(dst + offset, src, n);
          return absl::OkStatus();
        }));
  });
  return Seconds(start, Clock::now());
}

double Verify(const std::string& dir, const CheckpointIoOptions& io) {
  const auto start = Clock::now();
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(dir, "bench", io);
  BENCH_CHECK_OK(reader.status());
  BENCH_CHECK_OK((*reader)->Verify());
  return Seconds(start, Clock::now());
}

void DropCheckpointCache(const std::string& ckpt) {
  for (const auto& entry : std::filesystem::directory_iterator(ckpt)) DropCache(entry.path());
}

int Run() {
  GptShape shape;
  shape.hidden = 2048;
  shape.heads = 16;
  shape.ffn = 8192;
  shape.positions = 2048;
  shape.layers = absl::GetFlag(FLAGS_layers);
  std::vector<ParamInfo> params = GptRest(shape);
  for (int l = 0; l < shape.layers; ++l) {
    std::vector<ParamInfo> layer = GptLayer(shape, l);
    params.insert(params.end(), layer.begin(), layer.end());
  }
  const int ranks = absl::GetFlag(FLAGS_ranks);
  const std::string root = absl::StrCat(absl::GetFlag(FLAGS_dir), "/checkpoint_bench.", ::getpid());
  std::filesystem::create_directories(root);
  CheckpointIoOptions io;
  io.staging_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_staging_mib)) << 20;

  ResetPeakRss();
  State s = MakeState(params, absl::GetFlag(FLAGS_hold_state));
  std::vector<double> costs;
  for (const ParamInfo& p : params) costs.push_back(static_cast<double>(p.numel()));
  const std::vector<int> owner = PartitionByCost(costs, ranks).owner;
  std::printf(
      "checkpoint_bench: %zu parameters, %.3fB elements, %zu tensors, %.2f GB of state "
      "(%.2f GB held); %d shard(s), staging %d MiB, %s\n",
      params.size(), static_cast<double>(CountElements(params)) / 1e9, s.keys.size(), s.bytes / 1e9,
      s.held / 1e9, ranks, absl::GetFlag(FLAGS_staging_mib),
      absl::GetFlag(FLAGS_callbacks) ? "reader callbacks" : "host pointers");

  const std::string raw = root + "/raw.bin";
  const std::string ckpt = root + "/bench";
  double raw_write = 1e30, save = 1e30, raw_read = 1e30, load = 1e30, verify = 1e30,
         load_verified = 1e30;
  for (int round = 0; round < absl::GetFlag(FLAGS_repeats); ++round) {
    // Both write new files; the order alternates so that neither always goes first.
    std::filesystem::remove_all(ckpt);
    std::filesystem::remove(raw);
    for (int i = 0; i < 2; ++i) {
      if ((i + round) % 2 == 0) {
        raw_write = std::min(raw_write, RawWrite(s, raw));
        DropCache(raw);
      } else {
        save = std::min(save, Save(s, owner, root, ranks, io, absl::GetFlag(FLAGS_callbacks)));
        DropCheckpointCache(ckpt);
      }
    }
    raw_read = std::min(raw_read, RawRead(s, raw));
    DropCache(raw);
    load = std::min(load, Load(s, root, ranks, io));
    DropCheckpointCache(ckpt);
    verify = std::min(verify, Verify(root, io));
    DropCheckpointCache(ckpt);
    load_verified = std::min(load_verified, LoadVerified(s, root, ranks, io));
    DropCheckpointCache(ckpt);
  }
  std::filesystem::remove_all(root);

  const double gb = s.bytes / 1e9;
  std::printf("\n%-30s %8s %10s %8s\n", "phase", "seconds", "GB/s", "ratio");
  std::printf("%-30s %8.2f %10.3f %8s\n", "raw write + fsync", raw_write, gb / raw_write, "");
  std::printf("%-30s %8.2f %10.3f %8.2f\n", "checkpoint save", save, gb / save, raw_write / save);
  std::printf("%-30s %8.2f %10.3f %8s\n", "raw read", raw_read, gb / raw_read, "");
  std::printf("%-30s %8.2f %10.3f %8.2f\n", "checkpoint load", load, gb / load, raw_read / load);
  std::printf("%-30s %8.2f %10.3f %8.2f\n", "checkpoint verify (CRC-32C)", verify, gb / verify,
              raw_read / verify);
  std::printf("%-30s %8.2f %10.3f %8.2f\n", "checkpoint load + verify", load_verified,
              gb / load_verified, raw_read / load_verified);
  std::printf(
      "\npeak RSS %.2f GB, memory held %.2f GB (ratio = raw seconds / checkpoint "
      "seconds, best of %d rounds; goal >= 0.7)\n",
      PeakRssBytes() / 1e9, s.held / 1e9, absl::GetFlag(FLAGS_repeats));
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace optstep

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return optstep::bench::Run();
}
