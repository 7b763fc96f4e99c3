// The instruction-set variants of the CPU device's element-wise loops: every variant this CPU can
// run gives the same bits as the baseline on random inputs (specials, denormals and ragged
// lengths included), and the device picks, reports and refuses variants as documented.

#include "kernels/cpu/cpu_elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/dtype.h"
#include "kernels/math/elementwise.h"
#include "kernels/math/emerging.h"
#include "kernels/math/weight_decay.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace internal {
namespace {

using ::optstep::testutil::StatusIs;

// Not a multiple of any vector width, and started one element past an aligned address below, so
// that every variant runs its peeled head, its vector body and its tail.
constexpr int64_t kN = 4099;

// Random floats over many binades, with ±0, ±Inf, NaN and denormals mixed in.
std::vector<float> RandomFloats(uint32_t seed, float scale, bool positive = false) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> binade(-30, 10);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<float> out(kN + 1);
  for (float& x : out) {
    const int p = pick(rng);
    if (p == 0) {
      x = std::numeric_limits<float>::infinity();
    } else if (p == 1) {
      x = std::numeric_limits<float>::quiet_NaN();
    } else if (p == 2) {
      x = -0.0f;
    } else if (p == 3) {
      x = std::numeric_limits<float>::denorm_min() * static_cast<float>(1 + pick(rng));
    } else {
      x = scale * std::ldexp(mantissa(rng), binade(rng));
    }
    if (positive) x = std::fabs(x);
  }
  return out;
}

std::vector<CpuIsa> WiderVariants() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (static_cast<int>(isa) <= static_cast<int>(DetectCpuIsa())) out.push_back(isa);
  }
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Buffers of one update, run through one table.
struct Buffers {
  std::vector<float> g = RandomFloats(1, 1.0f);
  std::vector<float> p = RandomFloats(2, 2.0f);
  std::vector<float> m = RandomFloats(3, 0.1f);
  std::vector<float> v = RandomFloats(4, 0.5f, /*positive=*/true);
  std::vector<float> d = RandomFloats(5, 1.0f);

  bool operator==(const Buffers& o) const {
    return SameBits(g, o.g) && SameBits(p, o.p) && SameBits(m, o.m) && SameBits(v, o.v) &&
           SameBits(d, o.d);
  }
};

// Runs `run(table, buffers)` on the baseline and on each wider variant and compares every buffer.
template <typename Run>
void ExpectSameBits(const char* what, const Run& run) {
  Buffers expected;
  run(BaselineElementwiseKernels(), expected);
  for (CpuIsa isa : WiderVariants()) {
    Buffers got;
    run(ElementwiseKernels(isa), got);
    EXPECT_TRUE(got == expected) << what << ": " << CpuIsaName(isa) << " differs from baseline";
  }
}

class CpuElementwiseVariantsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (WiderVariants().empty()) GTEST_SKIP() << "this CPU runs only the baseline variant";
  }
};

TEST_F(CpuElementwiseVariantsTest, UpdatesGiveTheBaselineBits) {
  for (bool decoupled : {true, false}) {
    const math::AdamWArgs a = math::MakeAdamWArgs(1e-3, 0.9, 0.999, 1e-8, 0.01, decoupled, true, 7);
    ExpectSameBits("adamw", [&](const CpuElementwiseKernels& k, Buffers& b) {
      k.adamw(a, b.g.data() + 1, b.p.data() + 1, b.m.data() + 1, b.v.data() + 1, kN);
    });
  }
  for (float momentum : {0.0f, 0.9f}) {
    for (bool nesterov : {false, true}) {
      for (bool first : {false, true}) {
        math::SgdArgs a;
        a.lr = 0.01f;
        a.momentum = momentum;
        a.weight_decay = 1e-4f;
        a.nesterov = nesterov && momentum != 0.0f;
        a.first_step = first;
        ExpectSameBits("sgd", [&](const CpuElementwiseKernels& k, Buffers& b) {
          k.sgd(a, b.g.data() + 1, b.p.data() + 1, momentum == 0.0f ? nullptr : b.m.data() + 1, kN);
        });
      }
    }
  }
  for (math::WeightDecayMode mode : {math::WeightDecayMode::kDecoupled, math::WeightDecayMode::kL2,
                                     math::WeightDecayMode::kPalm}) {
    for (double lambda : {0.0, 0.1}) {
      const math::LionArgs lion = math::MakeLionArgs(1e-4, 0.9, 0.99, mode, lambda);
      ExpectSameBits("lion", [&](const CpuElementwiseKernels& k, Buffers& b) {
        k.lion(lion, b.g.data() + 1, b.p.data() + 1, b.m.data() + 1, kN);
      });
      for (bool nesterov : {false, true}) {
        const math::MuonMomentumArgs muon =
            math::MakeMuonMomentumArgs(0.95, nesterov, mode, 0.02, lambda);
        ExpectSameBits("muon_momentum", [&](const CpuElementwiseKernels& k, Buffers& b) {
          k.muon_momentum(muon, b.g.data() + 1, b.p.data() + 1, b.m.data() + 1, b.d.data() + 1, kN);
        });
      }
    }
  }
  const math::Moment2Args m2 = math::MakeMoment2Args(0.02, 0.95, 1e-8, 1);
  ExpectSameBits("adamuon", [&](const CpuElementwiseKernels& k, Buffers& b) {
    k.adamuon(m2, b.g.data() + 1, b.p.data() + 1, b.v.data() + 1, kN);
  });
  for (bool nesterov : {false, true}) {
    const math::SoapAdamArgs soap = math::MakeSoapAdamArgs(0.9, 0.95, 1e-8, true, nesterov, 3);
    ExpectSameBits("soap_adam", [&](const CpuElementwiseKernels& k, Buffers& b) {
      k.soap_adam(soap, b.g.data() + 1, b.m.data() + 1, b.v.data() + 1, b.d.data() + 1, kN);
    });
  }
}

TEST_F(CpuElementwiseVariantsTest, VectorOperationsGiveTheBaselineBits) {
  ExpectSameBits("add", [](const CpuElementwiseKernels& k, Buffers& b) {
    k.add(b.g.data() + 1, b.p.data() + 1, kN);
  });
  ExpectSameBits("scale", [](const CpuElementwiseKernels& k, Buffers& b) {
    k.scale(0.3f, b.p.data() + 1, kN);
  });
  for (float beta : {0.0f, 0.7f}) {
    ExpectSameBits("axpby", [&](const CpuElementwiseKernels& k, Buffers& b) {
      k.axpby(1.5f, b.g.data() + 1, beta, b.p.data() + 1, kN);
      k.axpby(-0.5f, b.m.data() + 1, beta, b.m.data() + 1, kN);  // x aliases y
    });
  }
  // Finite inputs (a NaN or Inf would make every variant's sum NaN or Inf alike).
  std::vector<float> x = RandomFloats(9, 3.0f);
  for (float& f : x) f = std::isfinite(f) ? f : 1.0f;
  const double expected = BaselineElementwiseKernels().sum_squares(x.data() + 1, kN);
  for (CpuIsa isa : WiderVariants()) {
    const double got = ElementwiseKernels(isa).sum_squares(x.data() + 1, kN);
    EXPECT_EQ(std::memcmp(&got, &expected, sizeof(double)), 0)
        << CpuIsaName(isa) << ": " << got << " vs " << expected;
  }
}

TEST_F(CpuElementwiseVariantsTest, ConversionsGiveTheBaselineBits) {
  // Every 16-bit pattern, widened.
  std::vector<uint16_t> halves(1 << 16);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i);
  // Random fp32 bit patterns (every class: NaNs with payloads, denormals, ties), narrowed.
  std::mt19937 rng(11);
  std::vector<float> floats(1 << 16);
  for (float& f : floats) {
    const uint32_t bits = rng();
    std::memcpy(&f, &bits, sizeof(f));
  }
  const int64_t n = static_cast<int64_t>(halves.size()) - 1;
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    std::vector<float> wide_expected(halves.size()), wide_got(halves.size());
    std::vector<uint16_t> narrow_expected(floats.size()), narrow_got(floats.size());
    BaselineElementwiseKernels().host_to_f32(halves.data() + 1, dtype, n, wide_expected.data());
    BaselineElementwiseKernels().f32_to_host(floats.data() + 1, n, dtype, narrow_expected.data());
    for (CpuIsa isa : WiderVariants()) {
      ElementwiseKernels(isa).host_to_f32(halves.data() + 1, dtype, n, wide_got.data());
      ElementwiseKernels(isa).f32_to_host(floats.data() + 1, n, dtype, narrow_got.data());
      EXPECT_TRUE(SameBits(wide_got, wide_expected)) << DTypeName(dtype) << " " << CpuIsaName(isa);
      EXPECT_EQ(narrow_got, narrow_expected) << DTypeName(dtype) << " " << CpuIsaName(isa);
    }
  }
}

// The device runs the variant it was given, end to end: AdamW over enough elements to split
// across threads, from bf16 gradients accumulated with AddFromHost, and the gradient norm.
TEST_F(CpuElementwiseVariantsTest, DeviceStepsGiveTheBaselineBits) {
  constexpr int64_t kParams = (int64_t{1} << 17) + 3;
  std::vector<uint16_t> grad_bf16(kParams);
  std::mt19937 rng(5);
  for (uint16_t& h : grad_bf16)
    h = static_cast<uint16_t>(0x3c00u + rng() % 0x0800u) ^ (rng() & 1u ? 0x8000u : 0u);
  std::vector<float> init = RandomFloats(6, 1.0f);
  for (float& f : init) f = std::isfinite(f) ? f : 0.5f;

  auto run = [&](const std::string& isa, double* sum_squares) {
    CpuDevice::Options options;
    options.num_threads = 2;
    options.isa = isa;
    std::unique_ptr<CpuDevice> device = *CpuDevice::Create(options);
    EXPECT_EQ(device->cpu_isa(), isa);
    Tensor g = *device->Allocate(DType::kF32, {kParams});
    Tensor p = *device->Allocate(DType::kF32, {kParams});
    Tensor m = *device->Allocate(DType::kF32, {kParams});
    Tensor v = *device->Allocate(DType::kF32, {kParams});
    for (int64_t i = 0; i < kParams; i += kN) {
      const int64_t c = std::min(kN, kParams - i);
      EXPECT_TRUE(device->CopyFromHost(init.data(), DType::kF32, c, p, i).ok());
    }
    for (int micro = 0; micro < 2; ++micro) {
      EXPECT_TRUE(device->AddFromHost(grad_bf16.data(), DType::kBF16, kParams, g, 0).ok());
    }
    *sum_squares = device->ComputeGradientStats(g)->sum_squares;
    for (int step = 1; step <= 3; ++step) {
      const math::AdamWArgs a = math::MakeAdamWArgs(1e-3, 0.9, 0.999, 1e-8, 0.01, true, true, step);
      EXPECT_TRUE(device->updates().AdamW(a, g, p, m, v).ok());
    }
    std::vector<uint16_t> out(kParams);
    EXPECT_TRUE(device->CopyToHost(p, 0, kParams, DType::kBF16, out.data()).ok());
    std::vector<float> master(kParams);
    EXPECT_TRUE(device->CopyToHost(p, 0, kParams, DType::kF32, master.data()).ok());
    return std::make_pair(out, master);
  };
  double expected_sum = 0.0;
  const auto expected = run("baseline", &expected_sum);
  for (CpuIsa isa : WiderVariants()) {
    double sum = 0.0;
    const auto got = run(CpuIsaName(isa), &sum);
    EXPECT_EQ(got.first, expected.first) << CpuIsaName(isa);
    EXPECT_TRUE(SameBits(got.second, expected.second)) << CpuIsaName(isa);
    EXPECT_EQ(sum, expected_sum) << CpuIsaName(isa);
  }
}

TEST(CpuIsaTest, NamesRoundTrip) {
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    EXPECT_EQ(*ParseCpuIsa(CpuIsaName(isa)), isa);
  }
  EXPECT_THAT(ParseCpuIsa("sse"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "OPTSTEP_CPU_ISA=sse: expected baseline, avx2 or avx512"));
}

TEST(CpuIsaTest, ResolveForcesOnlyLowerVariants) {
  EXPECT_EQ(*ResolveCpuIsa(nullptr, CpuIsa::kAvx2), CpuIsa::kAvx2);
  EXPECT_EQ(*ResolveCpuIsa("", CpuIsa::kAvx512), CpuIsa::kAvx512);
  EXPECT_EQ(*ResolveCpuIsa("baseline", CpuIsa::kAvx512), CpuIsa::kBaseline);
  EXPECT_EQ(*ResolveCpuIsa("avx2", CpuIsa::kAvx2), CpuIsa::kAvx2);
  EXPECT_THAT(ResolveCpuIsa("avx512", CpuIsa::kAvx2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "OPTSTEP_CPU_ISA=avx512: this CPU supports at most avx2"));
  EXPECT_THAT(ResolveCpuIsa("AVX2", CpuIsa::kAvx512),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected baseline, avx2 or avx512"));
}

TEST(CpuIsaTest, DeviceReportsItsVariant) {
  std::unique_ptr<CpuDevice> widest = *CpuDevice::Create({});
  if (std::getenv(kCpuIsaEnv) == nullptr) {
    EXPECT_EQ(widest->isa(), DetectCpuIsa());
  }
  CpuDevice::Options options;
  options.isa = "baseline";
  std::unique_ptr<CpuDevice> baseline = *CpuDevice::Create(options);
  EXPECT_EQ(baseline->isa(), CpuIsa::kBaseline);
  EXPECT_EQ(baseline->cpu_isa(), "baseline");
  options.isa = "avx1024";
  EXPECT_THAT(CpuDevice::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, "OPTSTEP_CPU_ISA=avx1024"));
}

}  // namespace
}  // namespace internal
}  // namespace optstep
