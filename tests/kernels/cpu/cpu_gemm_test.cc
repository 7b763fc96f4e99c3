// The CPU device's GEMM backends: OPTSTEP_CPU_GEMM / Options::gemm resolution, oneDNN's bf16
// matmul taken for `medium` products where the CPU has bf16 instructions, and its results against
// the OpenBLAS path and the exact product of the bf16-rounded inputs.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/cpu_gemm_backend.h"
#include "kernels/cpu/cpu_matrix_kernels.h"
#include "kernels/dtype.h"
#include "kernels/math/half.h"
#include "kernels/matrix_types.h"
#include "kernels/tensor.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::StatusIs;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

float Bf16(float x) { return math::Bf16ToFloat(math::FloatToBf16(x)); }

std::unique_ptr<CpuDevice> MakeCpu(const std::string& gemm) {
  CpuDevice::Options options;
  options.num_threads = 2;
  options.gemm = gemm;
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create(options);
  EXPECT_TRUE(device.ok()) << device.status();
  return device.ok() ? *std::move(device) : nullptr;
}

TEST(CpuGemmBackendTest, ResolvesTheEnvironmentValue) {
  for (const char* automatic : {static_cast<const char*>(nullptr), "", "auto"}) {
    EXPECT_EQ(*ResolveCpuGemmBackend(automatic, true), CpuGemmBackend::kOneDnn);
    EXPECT_EQ(*ResolveCpuGemmBackend(automatic, false), CpuGemmBackend::kOpenBlas);
  }
  EXPECT_EQ(*ResolveCpuGemmBackend("openblas", true), CpuGemmBackend::kOpenBlas);
  EXPECT_EQ(*ResolveCpuGemmBackend("onednn", true), CpuGemmBackend::kOneDnn);
  EXPECT_THAT(ResolveCpuGemmBackend("onednn", false),
              StatusIs(kInvalid, "OPTSTEP_CPU_GEMM=onednn: oneDNN finds no AVX512-BF16 or AMX"));
  EXPECT_THAT(ResolveCpuGemmBackend("mkl", true),
              StatusIs(kInvalid, "OPTSTEP_CPU_GEMM=mkl: expected auto, openblas or onednn"));
  CpuDevice::Options options;
  options.gemm = "blis";
  EXPECT_THAT(CpuDevice::Create(options), StatusIs(kInvalid, "OPTSTEP_CPU_GEMM=blis"));
}

TEST(CpuGemmBackendTest, DeviceReportsItsBackend) {
  EXPECT_EQ(MakeCpu("openblas")->gemm_backend(), "openblas");
  EXPECT_EQ(MakeCpu("")->gemm_backend(), OneDnnHasBf16Isa() ? "onednn" : "openblas");
}

struct Case {
  int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
};

const Case kCases[] = {
    {33, 17, 65, false, false, 1.0f, 0.0f},
    {33, 17, 65, true, false, 0.5f, 1.0f},
    {33, 17, 65, false, true, -2.0f, 0.25f},
    {16, 40, 9, true, true, 1.0f, -1.0f},
    {1, 1, 1, false, false, 3.0f, 0.0f},
    {96, 96, 256, false, true, 1.0f, 0.0f},
    {128, 128, 128, false, false, 3.4445f, -4.775f},  // Newton–Schulz's B = b·A + c·A·A
    {64, 300, 64, false, false, 1.0f, 2.0315f},       // and Y = a·X + B·X
};

// Σ_p op(A)[i,p]·op(B)[p,j] in float64 and Σ|α·a·b| + |β·c|, element (i, j) of row-major C.
struct Exact {
  std::vector<double> value, scale;
};

Exact ExactProduct(const Case& c, const std::vector<float>& a, const std::vector<float>& b,
                   const std::vector<float>& c0) {
  Exact e{std::vector<double>(c.m * c.n), std::vector<double>(c.m * c.n)};
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0.0, abs = 0.0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double x = c.ta ? a[p * c.m + i] : a[i * c.k + p];
        const double y = c.tb ? b[j * c.k + p] : b[p * c.n + j];
        sum += x * y;
        abs += std::fabs(x * y);
      }
      const double old = c.beta == 0.0f ? 0.0 : static_cast<double>(c.beta) * c0[i * c.n + j];
      e.value[i * c.n + j] = c.alpha * sum + old;
      e.scale[i * c.n + j] = std::fabs(c.alpha) * abs + std::fabs(old);
    }
  }
  return e;
}

std::vector<float> Normal(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A `dtype` tensor of `values` on `device` (rounded to nearest even for bf16).
Tensor MakeTensor(CpuDevice& device, DType dtype, const Shape& shape,
                  const std::vector<float>& values) {
  Tensor f32 = *device.Allocate(DType::kF32, shape);
  EXPECT_TRUE(device.CopyFromHost(values.data(), DType::kF32, f32.numel(), f32, 0).ok());
  if (dtype == DType::kF32) return f32;
  Tensor t = *device.Allocate(dtype, shape);
  EXPECT_TRUE(device.Convert(f32, t).ok());
  return t;
}

std::vector<float> ReadTensor(CpuDevice& device, const Tensor& t) {
  if (t.dtype() != DType::kF32) {
    Tensor f32 = *device.Allocate(DType::kF32, t.shape());
    EXPECT_TRUE(device.Convert(t, f32).ok());
    return ReadTensor(device, f32);
  }
  std::vector<float> out(t.numel());
  EXPECT_TRUE(device.CopyToHost(t, 0, t.numel(), DType::kF32, out.data()).ok());
  return out;
}

// Both backends on `c` with `dtype` tensors of random inputs, and the exact product of the inputs
// as the tensors hold them (bf16-rounded; C too for bf16 tensors).
struct Outcome {
  std::vector<float> onednn, openblas;
  Exact want;
};

class OneDnnGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!OneDnnHasBf16Isa()) GTEST_SKIP() << "oneDNN finds no bf16 instructions on this CPU";
    device_ = MakeCpu("");
    ASSERT_NE(device_, nullptr);
    internal::CpuContext ctx;
    ctx.num_threads = 2;
    onednn_ = std::make_unique<CpuMatrixKernels>(ctx, CpuGemmBackend::kOneDnn);
    openblas_ = std::make_unique<CpuMatrixKernels>(ctx, CpuGemmBackend::kOpenBlas);
  }

  Tensor Make(DType dtype, const Shape& shape, const std::vector<float>& values) {
    return MakeTensor(*device_, dtype, shape, values);
  }
  std::vector<float> Read(const Tensor& t) { return ReadTensor(*device_, t); }

  // Runs `c` through both backends on `dtype` tensors; returns {oneDNN's C, OpenBLAS's C}.
  std::pair<std::vector<float>, std::vector<float>> RunBoth(const Case& c, DType dtype,
                                                            MatmulPrecision precision,
                                                            const std::vector<float>& a,
                                                            const std::vector<float>& b,
                                                            const std::vector<float>& c0) {
    const Tensor ta = Make(dtype, c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, a);
    const Tensor tb = Make(dtype, c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, b);
    Tensor c1 = Make(dtype, {c.m, c.n}, c0);
    Tensor c2 = Make(dtype, {c.m, c.n}, c0);
    const GemmArgs args{precision, c.ta, c.tb, c.alpha, c.beta};
    EXPECT_TRUE(onednn_->Gemm(args, ta, tb, c1).ok());
    EXPECT_TRUE(openblas_->Gemm(args, ta, tb, c2).ok());
    return {Read(c1), Read(c2)};
  }

  Outcome Compare(const Case& c, DType dtype, uint32_t seed);

  std::unique_ptr<CpuDevice> device_;
  std::unique_ptr<CpuMatrixKernels> onednn_;
  std::unique_ptr<CpuMatrixKernels> openblas_;
};

// The path is taken: `medium` products run on oneDNN's bf16 kernels (not its reference code),
// fp32 ones on OpenBLAS; the device's own matrix kernels do the same.
TEST_F(OneDnnGemmTest, MediumProductsRunOnOneDnnsBf16Kernels) {
  const Case c{64, 64, 64, false, false, 1.0f, 0.0f};
  const std::vector<float> a = Normal(c.m * c.k, 1), b = Normal(c.k * c.n, 2);
  RunBoth(c, DType::kF32, MatmulPrecision::kMedium, a, b, a);
  const std::string library = onednn_->last_gemm_library();
  EXPECT_TRUE(absl::StartsWith(library, "onednn:")) << library;
  EXPECT_TRUE(absl::StrContains(library, "bf16") || absl::StrContains(library, "amx")) << library;
  EXPECT_FALSE(absl::StrContains(library, "ref")) << library;
  EXPECT_EQ(openblas_->last_gemm_library(), "openblas");
  RunBoth(c, DType::kF32, MatmulPrecision::kHighest, a, b, a);
  EXPECT_EQ(onednn_->last_gemm_library(), "openblas");

  const Tensor x = Make(DType::kBF16, {c.m, c.k}, a);
  Tensor y = Make(DType::kBF16, {c.m, c.m}, std::vector<float>(c.m * c.m));
  auto& kernels = static_cast<CpuMatrixKernels&>(device_->matrix());
  OPTSTEP_ASSERT_OK(kernels.Gemm({MatmulPrecision::kMedium, false, true, 1.0f, 0.0f}, x, x, y));
  EXPECT_TRUE(absl::StartsWith(kernels.last_gemm_library(), "onednn:"))
      << kernels.last_gemm_library();
}

Outcome OneDnnGemmTest::Compare(const Case& c, DType dtype, uint32_t seed) {
  const std::vector<float> a = Normal(c.m * c.k, seed), b = Normal(c.k * c.n, seed + 1);
  const std::vector<float> c0 = Normal(c.m * c.n, seed + 2);
  std::vector<float> a16(a), b16(b), c_held(c0);
  for (float& x : a16) x = Bf16(x);
  for (float& x : b16) x = Bf16(x);
  if (dtype == DType::kBF16) {
    for (float& x : c_held) x = Bf16(x);
  }
  auto [onednn, openblas] = RunBoth(c, dtype, MatmulPrecision::kMedium, a, b, c0);
  return {std::move(onednn), std::move(openblas), ExactProduct(c, a16, b16, c_held)};
}

::testing::Message Describe(const Case& c) {
  return ::testing::Message() << c.m << "x" << c.n << "x" << c.k << " ta " << c.ta << " tb " << c.tb
                              << " alpha " << c.alpha << " beta " << c.beta;
}

// oneDNN's bf16 products equal the exact product of the bf16-rounded inputs to 1e-5 of
// Σ|α·a·b| + |β·c| (the conformance suite's `medium` bound on the CPU), and OpenBLAS's to 2e-5.
TEST_F(OneDnnGemmTest, MatchesTheReferencePathOnFp32Tensors) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(Describe(c));
    const Outcome r = Compare(c, DType::kF32, 3);
    for (size_t i = 0; i < r.onednn.size(); ++i) {
      const double scale = r.want.scale[i];
      ASSERT_LE(std::fabs(r.onednn[i] - r.want.value[i]), 1e-5 * scale) << "element " << i;
      ASSERT_LE(std::fabs(r.onednn[i] - r.openblas[i]), 2e-5 * scale) << "element " << i;
    }
  }
}

// bf16 tensors: one rounding of the fp32 result, so oneDNN and OpenBLAS agree to one bf16 ulp.
TEST_F(OneDnnGemmTest, MatchesTheReferencePathOnBf16Tensors) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(Describe(c));
    const Outcome r = Compare(c, DType::kBF16, 6);
    for (size_t i = 0; i < r.onednn.size(); ++i) {
      ASSERT_EQ(Bf16(r.onednn[i]), r.onednn[i]) << "element " << i;
      const double bound = 1e-4 * r.want.scale[i] + std::fabs(r.want.value[i]) / 256;
      ASSERT_LE(std::fabs(r.onednn[i] - r.want.value[i]), bound) << "element " << i;
      ASSERT_LE(std::fabs(r.onednn[i] - r.openblas[i]), 2 * bound) << "element " << i;
    }
  }
}

// SymmetricGemm: C {m, m} ← α·op(A)·op(B) + β·C for symmetric products on a symmetric C.
const Case kSymmetricCases[] = {
    {200, 200, 300, false, true, 1.0f, 0.0f},      // X·Xᵀ: 4 panels on 2 threads
    {100, 100, 40, true, false, 0.5f, 2.0f},       // Xᵀ·X
    {96, 96, 96, false, false, 2.0315f, -4.775f},  // Newton–Schulz's B = b·A + c·A·A
    {1, 1, 9, false, true, -0.5f, 2.0f},
};

// `c` through `kernels` on `dtype` tensors of `device`, one operand on both sides (X, or the
// symmetric S = X + Xᵀ when neither side is transposed), from C = R + Rᵀ; returns {C, the exact
// product of the inputs as the product sees them (bf16-rounded under `medium`)}.
std::pair<std::vector<float>, Exact> RunSymmetric(CpuDevice& device, MatrixKernels& kernels,
                                                  const Case& c, DType dtype,
                                                  MatmulPrecision precision) {
  const std::vector<float> x = Normal(c.m * c.k, 9), r = Normal(c.m * c.m, 10);
  std::vector<float> a(x), c0(c.m * c.m);
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.m; ++j) {
      c0[i * c.m + j] = r[i * c.m + j] + r[j * c.m + i];
      if (c.ta == c.tb) a[i * c.m + j] = x[i * c.m + j] + x[j * c.m + i];
    }
  }
  const Tensor ta = MakeTensor(device, dtype, c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, a);
  Tensor tc = MakeTensor(device, dtype, {c.m, c.m}, c0);
  EXPECT_TRUE(kernels.SymmetricGemm({precision, c.ta, c.tb, c.alpha, c.beta}, ta, ta, tc).ok());
  std::vector<float> a_used(a), c_start(c0);
  if (precision == MatmulPrecision::kMedium) {
    for (float& v : a_used) v = Bf16(v);
  }
  if (dtype == DType::kBF16) {
    for (float& v : c_start) v = Bf16(v);
  }
  return {ReadTensor(device, tc), ExactProduct(c, a_used, a_used, c_start)};
}

// |got − exact| ≤ 1e-5 of Σ|α·a·b| + |β·c| (the conformance suite's bound), for bf16 tensors
// 1e-4 of it plus one bf16 rounding of the value.
::testing::AssertionResult WithinConformanceBounds(const std::vector<float>& got, const Exact& want,
                                                   DType dtype) {
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = dtype == DType::kBF16
                             ? 1e-4 * want.scale[i] + std::fabs(want.value[i]) / 256
                             : 1e-5 * want.scale[i];
    if (!(std::fabs(got[i] - want.value[i]) <= bound)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want.value[i];
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult ExactlySymmetric(const std::vector<float>& c, int64_t m) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < i; ++j) {
      if (c[i * m + j] != c[j * m + i]) {
        return ::testing::AssertionFailure()
               << "(" << i << ", " << j << ") " << c[i * m + j] << " != " << c[j * m + i];
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// The OpenBLAS backend: fp32 tensors in panels of sgemm (bf16-rounded inputs under `medium`),
// bf16 tensors as one emulated Gemm, all mirrored: exactly symmetric, and the exact product to the
// conformance bounds (1e-5 of Σ|α·a·b| + |β·c|; one bf16 rounding of the result for bf16).
TEST(CpuSymmetricGemmTest, OpenBlasPanelsMatchTheExactProduct) {
  std::unique_ptr<CpuDevice> device = MakeCpu("openblas");
  ASSERT_NE(device, nullptr);
  auto& kernels = static_cast<CpuMatrixKernels&>(device->matrix());
  for (const Case& c : kSymmetricCases) {
    SCOPED_TRACE(Describe(c));
    for (auto [dtype, precision] : {std::pair{DType::kF32, MatmulPrecision::kHighest},
                                    {DType::kF32, MatmulPrecision::kMedium},
                                    {DType::kBF16, MatmulPrecision::kMedium}}) {
      SCOPED_TRACE(::testing::Message()
                   << DTypeName(dtype) << " " << MatmulPrecisionName(precision));
      const auto [got, want] = RunSymmetric(*device, kernels, c, dtype, precision);
      EXPECT_TRUE(ExactlySymmetric(got, c.m));
      EXPECT_EQ(kernels.last_gemm_library(), "openblas");
      EXPECT_TRUE(WithinConformanceBounds(got, want, dtype));
    }
  }
}

// oneDNN's bf16 panels: the same bounds, on its bf16 kernels.
TEST_F(OneDnnGemmTest, SymmetricPanelsRunOnOneDnnAndMatchTheExactProduct) {
  for (const Case& c : kSymmetricCases) {
    SCOPED_TRACE(Describe(c));
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(DTypeName(dtype));
      const auto [got, want] = RunSymmetric(*device_, *onednn_, c, dtype, MatmulPrecision::kMedium);
      EXPECT_TRUE(ExactlySymmetric(got, c.m));
      // Every panel (a block of C with ldc > n, weights from an offset into B) on oneDNN's
      // brgemm kernels, not a reference or gemm-based fallback: one name, "brg:" and the ISA.
      const std::string& library = onednn_->last_gemm_library();
      if (c.m >= 16) {
        EXPECT_TRUE(absl::StartsWith(library, "onednn:brg:")) << library;
        EXPECT_FALSE(absl::StrContains(library, ",")) << library;
      } else {
        EXPECT_TRUE(absl::StartsWith(library, "onednn:")) << library;
      }
      EXPECT_TRUE(WithinConformanceBounds(got, want, dtype));
    }
  }
}

// OpenBLAS, and oneDNN where it finds bf16 instructions.
std::vector<CpuGemmBackend> Backends() {
  std::vector<CpuGemmBackend> backends = {CpuGemmBackend::kOpenBlas};
  if (OneDnnHasBf16Isa()) backends.push_back(CpuGemmBackend::kOneDnn);
  return backends;
}

// Whether `got` holds the bits of `want`, element for element.
::testing::AssertionResult SameBits(const std::vector<float>& got, const std::vector<float>& want) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << got[i] << ", want " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Each panel mirrors its own rows below the diagonal inside the panels' parallel region: on two
// threads the result equals, bit for bit, the same panels run one after another on one thread, for
// odd sizes whose panels do not end on cache lines, with C starting non-symmetric (so an entry
// below the diagonal that no panel mirrored keeps its old value and breaks the symmetry).
TEST(CpuSymmetricGemmTest, PanelsOnTwoThreadsEqualOneThreadBitForBit) {
  std::unique_ptr<CpuDevice> device = MakeCpu("openblas");
  ASSERT_NE(device, nullptr);
  // Above the product size that SymmetricGemm splits over threads (2·m²·k ≥ 2^24 flops).
  const Case cases[] = {{131, 131, 509, false, true, 1.0f, 0.0f},
                        {157, 157, 389, true, false, 0.5f, 2.0f},
                        {211, 211, 211, false, false, 2.0315f, -4.775f}};
  for (CpuGemmBackend backend : Backends()) {
    internal::CpuContext two, one;
    two.num_threads = 2;
    CpuMatrixKernels parallel(two, backend), serial(one, backend);
    for (const Case& c : cases) {
      SCOPED_TRACE(Describe(c) << " " << CpuGemmBackendName(backend));
      const std::vector<float> a = Normal(c.m * c.k, 21), c0 = Normal(c.m * c.m, 22);
      for (auto [dtype, precision] : {std::pair{DType::kF32, MatmulPrecision::kHighest},
                                      {DType::kF32, MatmulPrecision::kMedium},
                                      {DType::kBF16, MatmulPrecision::kMedium}}) {
        if (dtype == DType::kBF16 && backend == CpuGemmBackend::kOpenBlas) continue;  // full Gemm
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(dtype) << " " << MatmulPrecisionName(precision));
        const Tensor x = MakeTensor(*device, dtype, c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, a);
        Tensor on_two = MakeTensor(*device, dtype, {c.m, c.m}, c0);
        Tensor on_one = MakeTensor(*device, dtype, {c.m, c.m}, c0);
        const GemmArgs args{precision, c.ta, c.tb, c.alpha, c.beta};
        OPTSTEP_ASSERT_OK(parallel.SymmetricGemm(args, x, x, on_two));
        OPTSTEP_ASSERT_OK(serial.SymmetricGemm(args, x, x, on_one));
        const std::vector<float> got = ReadTensor(*device, on_two);
        EXPECT_TRUE(ExactlySymmetric(got, c.m));
        EXPECT_TRUE(SameBits(got, ReadTensor(*device, on_one)));
      }
    }
  }
}

// GemmFrom (C ← α·op(A)·op(B) + β·D) on both backends: every thread copies its rows of D inside
// the product's region (oneDNN: blocks of rows, one single-threaded product each; both: the
// symmetric panels), with the bits of Copy(d, c) followed by the product; C starts from other
// values, so a row the split left out shows. Newton–Schulz's products of the GPT layer's matrices
// (768 × 768 and 768 × 3072, bf16) and odd sizes.
TEST(CpuGemmFromTest, EqualsCopyThenTheProductBitForBit) {
  std::unique_ptr<CpuDevice> device = MakeCpu("openblas");
  ASSERT_NE(device, nullptr);
  const Case cases[] = {{768, 768, 768, false, false, 1.0f, 3.7418f},
                        {768, 3072, 768, false, false, 1.0f, 2.8769f},
                        {768, 768, 768, false, false, 2.3037f, -5.5913f},  // symmetric A·A
                        {97, 301, 583, false, false, 1.0f, 2.5f},
                        {255, 1000, 255, false, true, -0.5f, 1.5f},
                        {211, 211, 211, false, false, 2.0315f, -4.775f}};  // symmetric
  for (CpuGemmBackend backend : Backends()) {
    internal::CpuContext ctx;
    ctx.num_threads = 2;
    CpuMatrixKernels kernels(ctx, backend);
    for (const Case& c : cases) {
      const bool symmetric = c.m == c.n && c.alpha != 1.0f;
      SCOPED_TRACE(Describe(c) << " " << CpuGemmBackendName(backend) << " symmetric " << symmetric);
      std::vector<float> a = Normal(c.m * c.k, 41);
      if (symmetric) {
        for (int64_t i = 0; i < c.m; ++i) {
          for (int64_t j = 0; j < i; ++j) a[i * c.m + j] = a[j * c.m + i];
        }
      }
      const std::vector<float> b = Normal(c.k * c.n, 42), d0 = Normal(c.m * c.n, 43),
                               c0 = Normal(c.m * c.n, 44);
      for (auto [dtype, precision] : {std::pair{DType::kF32, MatmulPrecision::kHighest},
                                      {DType::kF32, MatmulPrecision::kMedium},
                                      {DType::kBF16, MatmulPrecision::kMedium}}) {
        // The GPT layer's sizes only as Newton–Schulz runs them (bf16), to keep the test short.
        if (c.m == 768 && dtype != DType::kBF16) continue;
        SCOPED_TRACE(::testing::Message()
                     << DTypeName(dtype) << " " << MatmulPrecisionName(precision));
        const Tensor ta = MakeTensor(*device, dtype, {c.m, c.k}, a);
        const Tensor tb = MakeTensor(*device, dtype, c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, b);
        const Tensor& rhs = symmetric ? ta : tb;
        const Tensor td = MakeTensor(*device, dtype, {c.m, c.n}, d0);
        Tensor fused = MakeTensor(*device, dtype, {c.m, c.n}, c0);
        Tensor apart = MakeTensor(*device, dtype, {c.m, c.n}, d0);
        const GemmArgs args{precision, c.ta, c.tb, c.alpha, c.beta};
        if (symmetric) {
          OPTSTEP_ASSERT_OK(kernels.SymmetricGemmFrom(args, ta, rhs, td, fused));
          OPTSTEP_ASSERT_OK(kernels.SymmetricGemm(args, ta, rhs, apart));
        } else {
          OPTSTEP_ASSERT_OK(kernels.GemmFrom(args, ta, rhs, td, fused));
          OPTSTEP_ASSERT_OK(kernels.Gemm(args, ta, rhs, apart));
        }
        EXPECT_TRUE(SameBits(ReadTensor(*device, fused), ReadTensor(*device, apart)));
      }
    }
  }
}

// A cache too small for one product's panels (4 on 2 threads) is emptied while shapes, α and β
// change between calls: every panel still runs on the primitive prepared for it (the cache may
// not free one in use), and the results stay exact to the bounds.
TEST_F(OneDnnGemmTest, SymmetricPanelsSurviveTheirPrimitivesLeavingTheCache) {
  internal::CpuContext ctx;
  ctx.num_threads = 2;
  CpuMatrixKernels small(ctx, CpuGemmBackend::kOneDnn, /*dnnl_max_primitives=*/3);
  const Case cases[] = {{200, 200, 300, false, true, 1.0f, 0.0f},
                        {96, 96, 96, false, false, 2.0315f, -4.775f},
                        {120, 120, 40, true, false, 0.5f, 2.0f},
                        {96, 96, 96, false, false, -1.5f, 1.25f}};
  for (int round = 0; round < 2; ++round) {
    for (const Case& c : cases) {
      SCOPED_TRACE(Describe(c));
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        const auto [got, want] = RunSymmetric(*device_, small, c, dtype, MatmulPrecision::kMedium);
        EXPECT_TRUE(ExactlySymmetric(got, c.m));
        EXPECT_TRUE(WithinConformanceBounds(got, want, dtype));
        EXPECT_LE(small.dnnl()->cached_primitives(), 4u);
      }
    }
  }
  // Every call created its panels anew: the cache never held them all.
  EXPECT_GE(small.dnnl()->primitives_created(), 2 * 4 * 2 * 4);
}

// A product's primitives are kept: the same product again (Newton–Schulz's next step with the
// same coefficients, the next optimizer step) creates none.
TEST_F(OneDnnGemmTest, RepeatedSymmetricProductsReuseTheirPrimitives) {
  const Case c{96, 96, 96, false, false, 2.0315f, -4.775f};
  RunSymmetric(*device_, *onednn_, c, DType::kBF16, MatmulPrecision::kMedium);
  const int64_t created = onednn_->dnnl()->primitives_created();
  EXPECT_EQ(created, 4);  // one per panel
  const auto [got, want] =
      RunSymmetric(*device_, *onednn_, c, DType::kBF16, MatmulPrecision::kMedium);
  EXPECT_TRUE(WithinConformanceBounds(got, want, DType::kBF16));
  EXPECT_EQ(onednn_->dnnl()->primitives_created(), created);
}

}  // namespace
}  // namespace optstep
