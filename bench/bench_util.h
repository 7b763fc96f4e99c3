#ifndef OPTSTEP_BENCH_BENCH_UTIL_H_
#define OPTSTEP_BENCH_BENCH_UTIL_H_

// Shared pieces of the Google Benchmark binaries of bench/: the STREAM-like triad that measures
// this machine's memory bandwidth (the denominator of every "ratio"), first-touch buffers, peak
// RSS, and a reporter that prints a summary table of chosen counters at the end.
//
// Byte accounting (as in kernels_bench): bytes that cross the memory bus. The triad
// a[i] = b[i] + s·c[i] moves 12 B per element; with streaming (non-temporal) stores of `a` no
// line of `a` is read first, so 12 B is its exact bus traffic.

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"

namespace optstep {
namespace bench {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b);

// Runs `iteration()` once per benchmark iteration, each timed by the wall clock and reported as
// that iteration's manual time (UseManualTime); returns the seconds of all iterations.
template <typename Iteration>
double TimeIterations(benchmark::State& state, Iteration&& iteration) {
  double total = 0.0;
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    iteration();
    const double s = Seconds(start, Clock::now());
    state.SetIterationTime(s);
    total += s;
  }
  return total;
}

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], AlignedFree>;

// `n` floats, 64-byte aligned, set to `value` by the threads of a static OpenMP loop (first
// touch, so pages land where those threads run).
Buffer AllocateFirstTouch(int64_t n, float value);

// The triad benchmark body. Args: {elements per array, streaming stores (0/1)}. Counters: GB/s
// (12 B per element), and bus_GB/s (16 B, as if `a` were read first) for ordinary stores. A
// streaming run records its GB/s for TriadGbps().
void TriadBenchmark(benchmark::State& state);

// GB/s of the last streaming triad run; 0 until one ran.
double TriadGbps();

// CPU time of the whole process (all threads, user + system; getrusage), in seconds. On a shared
// machine wall time includes time slices lost to other processes; CPU time does not.
double ProcessCpuSeconds();

// Voluntary context switches of the whole process so far (getrusage ru_nvcsw): each is a thread
// going to sleep, such as an OpenMP worker waiting for the next parallel region under
// OMP_WAIT_POLICY=passive. Unlike wall time, a loaded machine barely changes the count.
int64_t ProcessSleeps();

// The process's peak resident set (getrusage ru_maxrss), in bytes.
int64_t PeakRssBytes();
// Resets the peak to the current resident set (Linux: /proc/self/clear_refs "5"), so that the
// next PeakRssBytes() covers only what follows. Best effort.
void ResetPeakRss();

// Passes every run on to the console and keeps the counters named in `columns` for a summary
// table printed by PrintSummary() (one row per benchmark run, "-" for a missing counter).
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  explicit SummaryReporter(std::vector<std::string> columns) : columns_(std::move(columns)) {}
  void ReportRuns(const std::vector<Run>& runs) override;
  void PrintSummary(const std::string& title) const;
  // The value of `counter` in the first run whose name contains `name_part`; NaN if none.
  double Find(const std::string& name_part, const std::string& counter) const;

 private:
  struct Row {
    std::string name;
    benchmark::UserCounters counters;
  };
  std::vector<std::string> columns_;
  std::vector<Row> rows_;
};

}  // namespace bench
}  // namespace optstep

#endif  // OPTSTEP_BENCH_BENCH_UTIL_H_
