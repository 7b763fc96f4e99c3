// Multi-tensor loops of the CPU device: ParallelSpans visits every element of every array once,
// in line-aligned ranges shared evenly by the threads, and AdamWBatch gives, at any thread count
// and in every instruction-set variant, the bits of AdamW stepped tensor by tensor.

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_loops.h"
#include "kernels/dtype.h"
#include "kernels/math/elementwise.h"
#include "kernels/tensor.h"
#include "kernels/update_kernels.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::StatusIs;

// Empty, sub-line, ragged, below and above the device's parallel threshold.
const std::vector<int64_t> kSizes = {0, 1, 17, 5000, 40000, 3, 70001, 16};

TEST(ParallelSpansTest, VisitsEveryElementOnceInAlignedEvenRanges) {
  int64_t padded = 0;
  for (int64_t n : kSizes) padded += (n + 15) / 16 * 16;
  for (int threads : {1, 2, 3}) {
    std::vector<std::vector<int>> visits;
    for (int64_t n : kSizes) visits.emplace_back(n, 0);
    std::vector<int64_t> per_thread(threads, 0);
    int team = 1;  // the threads the region got (OMP_THREAD_LIMIT may allow fewer)
    std::mutex mu;
    internal::ParallelSpans(kSizes, threads, [&](size_t k, int64_t begin, int64_t end) {
      std::lock_guard<std::mutex> lock(mu);
      team = std::max(team, omp_get_num_threads());
      EXPECT_LT(begin, end);
      EXPECT_EQ(begin % internal::kLineFloats, 0) << "array " << k << " at " << begin;
      for (int64_t i = begin; i < end; ++i) ++visits[k][i];
      per_thread[omp_get_thread_num()] += end - begin;
    });
    for (size_t k = 0; k < kSizes.size(); ++k) {
      for (int64_t i = 0; i < kSizes[k]; ++i) {
        ASSERT_EQ(visits[k][i], 1) << threads << " threads, array " << k << " element " << i;
      }
    }
    // Each thread's share of the padded elements is at most one line over an even split.
    const int64_t share = (padded + team - 1) / team + internal::kLineFloats;
    for (int t = 0; t < threads; ++t) EXPECT_LE(per_thread[t], share) << "thread " << t;
  }
}

std::vector<float> Values(uint32_t seed, float scale, bool positive) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> binade(-20, 4);
  std::vector<float> out(70001);
  for (float& x : out) {
    x = scale * std::ldexp(mantissa(rng), binade(rng));
    if (positive) x = std::fabs(x);
  }
  return out;
}

// One device's tensors of every size in kSizes but the empty one.
struct Tensors {
  std::vector<Tensor> g, p, m, v;
};

Tensors Make(CpuDevice& device) {
  const std::vector<float> g = Values(1, 1.0f, false), p = Values(2, 2.0f, false);
  const std::vector<float> m = Values(3, 0.1f, false), v = Values(4, 0.01f, true);
  Tensors t;
  for (int64_t n : kSizes) {
    if (n == 0) continue;
    for (auto [list, values] : {std::make_pair(&t.g, &g), std::make_pair(&t.p, &p),
                                std::make_pair(&t.m, &m), std::make_pair(&t.v, &v)}) {
      list->push_back(*device.Allocate(DType::kF32, {n}));
      EXPECT_TRUE(device.CopyFromHost(values->data(), DType::kF32, n, list->back(), 0).ok());
    }
  }
  return t;
}

std::vector<AdamWOperands> Operands(Tensors& t) {
  std::vector<AdamWOperands> out;
  for (size_t i = 0; i < t.p.size(); ++i) out.push_back({&t.g[i], &t.p[i], &t.m[i], &t.v[i]});
  return out;
}

std::vector<float> Host(CpuDevice& device, const std::vector<Tensor>& list) {
  std::vector<float> out;
  for (const Tensor& x : list) {
    std::vector<float> part(x.numel());
    EXPECT_TRUE(device.CopyToHost(x, 0, x.numel(), DType::kF32, part.data()).ok());
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::unique_ptr<CpuDevice> Device(int threads, const std::string& isa) {
  CpuDevice::Options options;
  options.num_threads = threads;
  options.isa = isa;
  return *CpuDevice::Create(options);
}

TEST(AdamWBatchTest, GivesTheBitsOfAdamWTensorByTensor) {
  std::unique_ptr<CpuDevice> reference_device = Device(1, "baseline");
  Tensors reference = Make(*reference_device);
  for (int step = 1; step <= 3; ++step) {
    const math::AdamWArgs a = math::MakeAdamWArgs(1e-3, 0.9, 0.999, 1e-8, 0.01, true, true, step);
    for (const AdamWOperands& t : Operands(reference)) {
      ASSERT_TRUE(
          reference_device->updates().AdamW(a, *t.grad, *t.param, *t.exp_avg, *t.exp_avg_sq).ok());
    }
  }
  std::vector<CpuIsa> variants = {CpuIsa::kBaseline};
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (static_cast<int>(isa) <= static_cast<int>(DetectCpuIsa())) variants.push_back(isa);
  }
  for (CpuIsa isa : variants) {
    for (int threads : {1, 2, 3}) {
      std::unique_ptr<CpuDevice> device = Device(threads, CpuIsaName(isa));
      Tensors got = Make(*device);
      for (int step = 1; step <= 3; ++step) {
        const math::AdamWArgs a =
            math::MakeAdamWArgs(1e-3, 0.9, 0.999, 1e-8, 0.01, true, true, step);
        ASSERT_TRUE(device->updates().AdamWBatch(a, Operands(got)).ok());
      }
      const std::string where =
          std::string(CpuIsaName(isa)) + ", " + std::to_string(threads) + " threads";
      EXPECT_TRUE(SameBits(Host(*device, got.p), Host(*reference_device, reference.p))) << where;
      EXPECT_TRUE(SameBits(Host(*device, got.m), Host(*reference_device, reference.m))) << where;
      EXPECT_TRUE(SameBits(Host(*device, got.v), Host(*reference_device, reference.v))) << where;
    }
  }
}

TEST(AdamWBatchTest, RefusesTheWholeBatchNamingTheParameter) {
  std::unique_ptr<CpuDevice> device = Device(2, "");
  Tensors t = Make(*device);
  const std::vector<float> before = Host(*device, t.p);
  std::vector<AdamWOperands> batch = Operands(t);
  batch[2].exp_avg = &t.m[3];  // 40000 elements against 5000
  const math::AdamWArgs a = math::MakeAdamWArgs(1e-3, 0.9, 0.999, 1e-8, 0.01, true, true, 1);
  EXPECT_THAT(device->updates().AdamWBatch(a, batch),
              StatusIs(absl::StatusCode::kInvalidArgument, "AdamWBatch: parameter 2 of 7: AdamW"));
  batch = Operands(t);
  batch[4].grad = nullptr;
  EXPECT_THAT(device->updates().AdamWBatch(a, batch),
              StatusIs(absl::StatusCode::kInvalidArgument, "parameter 4 of 7 has a null tensor"));
  EXPECT_TRUE(SameBits(Host(*device, t.p), before));
}

}  // namespace
}  // namespace optstep
