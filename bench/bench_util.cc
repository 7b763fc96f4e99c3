#include "bench/bench_util.h"

#include <omp.h>
#include <sys/resource.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include <cmath>
#include <cstdio>

namespace optstep {
namespace bench {
namespace {

constexpr double kTriadBytes = 12;
constexpr double kTriadWriteAllocateBytes = 16;

double g_triad_gbps = 0.0;

void Triad(float* __restrict a, const float* __restrict b, const float* __restrict c, float s,
           int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

// The triad with non-temporal stores of `a` (no write-allocate). REQUIRES: n % 4 == 0 and
// 16-byte aligned arrays.
void StreamingTriad(float* a, const float* b, const float* c, float s, int64_t n) {
#if defined(__SSE__)
  const __m128 vs = _mm_set1_ps(s);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i += 4) {
    _mm_stream_ps(a + i, _mm_add_ps(_mm_load_ps(b + i), _mm_mul_ps(vs, _mm_load_ps(c + i))));
  }
  _mm_sfence();
#else
  Triad(a, b, c, s, n);
#endif
}

}  // namespace

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

Buffer AllocateFirstTouch(int64_t n, float value) {
  Buffer b(static_cast<float*>(std::aligned_alloc(64, ((n * 4 + 63) / 64) * 64)));
  float* p = b.get();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = value;
  return b;
}

void TriadBenchmark(benchmark::State& state) {
  const int64_t n = state.range(0);
  const bool streaming = state.range(1) != 0;
  Buffer a = AllocateFirstTouch(n, 0.0f), b = AllocateFirstTouch(n, 1.0f),
         c = AllocateFirstTouch(n, 2.0f);
  auto run = [&] {
    if (streaming) {
      StreamingTriad(a.get(), b.get(), c.get(), 3.0f, n);
    } else {
      Triad(a.get(), b.get(), c.get(), 3.0f, n);
    }
  };
  run();  // warm up
  double total = 0.0;
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    run();
    benchmark::ClobberMemory();
    const double s = Seconds(start, Clock::now());
    state.SetIterationTime(s);
    total += s;
  }
  const double elems = static_cast<double>(n) * state.iterations();
  if (streaming) g_triad_gbps = elems * kTriadBytes / total / 1e9;
  state.counters["GB/s"] =
      benchmark::Counter(elems * kTriadBytes / 1e9, benchmark::Counter::kIsRate);
  if (!streaming) {
    state.counters["bus_GB/s"] =
        benchmark::Counter(elems * kTriadWriteAllocateBytes / 1e9, benchmark::Counter::kIsRate);
  }
  state.counters["threads"] = omp_get_max_threads();
}

double TriadGbps() { return g_triad_gbps; }

double ProcessCpuSeconds() {
  struct rusage usage;
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0.0;
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

int64_t ProcessSleeps() {
  struct rusage usage;
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_nvcsw);
}

int64_t PeakRssBytes() {
  struct rusage usage;
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

void ResetPeakRss() {
  if (FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
    std::fputs("5", f);
    std::fclose(f);
  }
}

void SummaryReporter::ReportRuns(const std::vector<Run>& runs) {
  for (const Run& run : runs) {
    if (run.run_type == Run::RT_Iteration) rows_.push_back({run.benchmark_name(), run.counters});
  }
  ConsoleReporter::ReportRuns(runs);
}

void SummaryReporter::PrintSummary(const std::string& title) const {
  std::printf("\n%s\n%-52s", title.c_str(), "benchmark");
  for (const std::string& c : columns_) std::printf(" %12s", c.c_str());
  std::printf("\n");
  for (const Row& row : rows_) {
    std::printf("%-52s", row.name.c_str());
    for (const std::string& c : columns_) {
      auto it = row.counters.find(c);
      if (it == row.counters.end()) {
        std::printf(" %12s", "-");
      } else {
        std::printf(" %12.4g", static_cast<double>(it->second.value));
      }
    }
    std::printf("\n");
  }
}

double SummaryReporter::Find(const std::string& name_part, const std::string& counter) const {
  for (const Row& row : rows_) {
    if (row.name.find(name_part) == std::string::npos) continue;
    auto it = row.counters.find(counter);
    if (it != row.counters.end()) return it->second.value;
  }
  return std::nan("");
}

}  // namespace bench
}  // namespace optstep
