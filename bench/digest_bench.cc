// The cost of digesting a trainer's gradient bytes (ContributionDigest, which a replay or retry
// of a step is compared with) against copying the same bytes, as the Step stream copies them
// into the gradient buffer.
//
//   bazel run -c opt //bench:digest_bench
//
// BM_Digest adds 256 MiB of one parameter's gradient in 4 MiB chunks of 64 KiB pieces (the
// network's slices); BM_Copy memcpys the same chunks. Both report bytes per second on one core
// (1 / that: seconds per GB of gradients). Measured: about 10 GB/s for each, so the digest adds
// about 0.1 s per GB, as much as the copy it goes with.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "benchmark/benchmark.h"
#include "kernels/dtype.h"
#include "server/engine/contribution_digest.h"

namespace optstep {
namespace {

constexpr size_t kChunkBytes = 4 << 20;
constexpr size_t kPieceBytes = 64 << 10;
constexpr size_t kTotalBytes = 256 << 20;

const std::string& Gradient() {
  static const std::string bytes = [] {
    std::string b(kTotalBytes, '\0');
    uint64_t x = 1;
    for (size_t i = 0; i + 8 <= b.size(); i += 8) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      std::memcpy(&b[i], &x, 8);
    }
    return b;
  }();
  return bytes;
}

void BM_Digest(benchmark::State& state) {
  const std::string& bytes = Gradient();
  for (auto _ : state) {
    ContributionDigest digest;
    for (size_t chunk = 0; chunk < bytes.size(); chunk += kChunkBytes) {
      std::vector<absl::string_view> pieces;
      for (size_t at = chunk; at < chunk + kChunkBytes; at += kPieceBytes) {
        pieces.push_back(absl::string_view(bytes).substr(at, kPieceBytes));
      }
      digest.Add(0, DType::kF32, static_cast<int64_t>(chunk / 4), pieces);
    }
    benchmark::DoNotOptimize(digest);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes.size()));
}
BENCHMARK(BM_Digest)->Unit(benchmark::kMillisecond);

void BM_Copy(benchmark::State& state) {
  const std::string& bytes = Gradient();
  std::vector<char> buffer(bytes.size());
  for (auto _ : state) {
    for (size_t chunk = 0; chunk < bytes.size(); chunk += kChunkBytes) {
      std::memcpy(buffer.data() + chunk, bytes.data() + chunk, kChunkBytes);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes.size()));
}
BENCHMARK(BM_Copy)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace optstep

BENCHMARK_MAIN();
