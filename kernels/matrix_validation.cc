#include "kernels/matrix_validation.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/device_validation.h"
#include "base/status_macros.h"

namespace optstep {
namespace internal {
namespace {

absl::Status CheckMatrix(absl::string_view op, absl::string_view name, const Tensor& t) {
  OPTSTEP_RETURN_IF_ERROR(CheckF32(op, name, t));
  if (t.ndim() == 2) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", name, " must be a matrix, got shape ", ShapeString(t.shape())));
}

// `v` has shape {m, 1} or {1, n} for the {m, n} `matrix`.
absl::Status CheckAxisVector(absl::string_view op, absl::string_view name, const Tensor& v,
                             const Tensor& matrix) {
  OPTSTEP_RETURN_IF_ERROR(CheckF32(op, name, v));
  const Shape rows = {matrix.dim(0), 1};
  const Shape cols = {1, matrix.dim(1)};
  if (v.shape() == rows || v.shape() == cols) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": ", name, " has shape ", ShapeString(v.shape()), "; a ", ShapeString(matrix.shape()),
      " matrix needs ", ShapeString(rows), " or ", ShapeString(cols)));
}

absl::Status CheckShape(absl::string_view op, absl::string_view name, const Tensor& t,
                        const Shape& want) {
  if (t.shape() == want) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": ", name, " has shape ", ShapeString(t.shape()), ", expected ", ShapeString(want)));
}

// rows [first + b·stride, + block_rows) for b < num_blocks lie inside [0, rows).
absl::Status CheckBlocks(absl::string_view name, int64_t first, int64_t stride,
                         const RowBlockCopy& c, int64_t rows) {
  if (first < 0 || stride < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CopyRowBlocks: negative ", name, " first row ",
                                                   first, " or stride ", stride));
  }
  if (c.num_blocks == 0 || c.block_rows == 0) return absl::OkStatus();
  if (c.num_blocks > 1 && stride < c.block_rows) {
    return absl::InvalidArgumentError(absl::StrCat("CopyRowBlocks: ", name, " blocks of ",
                                                   c.block_rows, " rows with stride ", stride,
                                                   " overlap"));
  }
  const __int128 end = static_cast<__int128>(first) +
                       static_cast<__int128>(c.num_blocks - 1) * stride + c.block_rows;
  if (end <= rows) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("CopyRowBlocks: ", c.num_blocks, " blocks of ", c.block_rows, " rows from ",
                   name, " row ", first, " with stride ", stride, " exceed its ", rows, " rows"));
}

}  // namespace

bool PerRow(const Tensor& v, const Tensor& matrix) {
  return v.dim(1) == 1 && (v.dim(0) != 1 || matrix.dim(0) == 1);
}

absl::Status CheckGemm(const GemmArgs& args, const Tensor& a, const Tensor& b, const Tensor& c) {
  constexpr absl::string_view kOp = "Gemm";
  for (const auto& [name, t] :
       {std::pair<const char*, const Tensor*>{"a", &a}, {"b", &b}, {"c", &c}}) {
    if (!t->defined())
      return absl::InvalidArgumentError(absl::StrCat("Gemm: ", name, " is not allocated"));
    if (t->ndim() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("Gemm: ", name, " must be a matrix, got shape ", ShapeString(t->shape())));
    }
  }
  if (a.dtype() != b.dtype() || a.dtype() != c.dtype() ||
      (a.dtype() != DType::kF32 && a.dtype() != DType::kBF16)) {
    return absl::InvalidArgumentError(absl::StrCat("Gemm: a, b, c are ", DTypeName(a.dtype()), ", ",
                                                   DTypeName(b.dtype()), ", ", DTypeName(c.dtype()),
                                                   "; they must be all fp32 or all bf16"));
  }
  const int p = static_cast<int>(args.precision);
  if (p < 0 || p > 2) {
    return absl::InvalidArgumentError(absl::StrCat("Gemm: unknown precision ", p));
  }
  if (a.dtype() == DType::kBF16 && args.precision != MatmulPrecision::kMedium) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Gemm: bf16 matrices need precision medium, got ", MatmulPrecisionName(args.precision)));
  }
  if (!std::isfinite(args.alpha) || !std::isfinite(args.beta)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gemm: alpha ", args.alpha, " and beta ", args.beta, " must be finite"));
  }
  const Shape op_a = args.transpose_a ? Shape{a.dim(1), a.dim(0)} : a.shape();
  const Shape op_b = args.transpose_b ? Shape{b.dim(1), b.dim(0)} : b.shape();
  if (op_a[1] != op_b[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gemm: op(a) is ", ShapeString(op_a), " but op(b) is ", ShapeString(op_b)));
  }
  OPTSTEP_RETURN_IF_ERROR(CheckShape(kOp, "c", c, {op_a[0], op_b[1]}));
  OPTSTEP_RETURN_IF_ERROR(CheckDistinct(kOp, "c", c, "a", a));
  return CheckDistinct(kOp, "c", c, "b", b);
}

absl::Status CheckGemmFrom(const GemmArgs& args, bool symmetric, const Tensor& a, const Tensor& b,
                           const Tensor& d, const Tensor& c) {
  OPTSTEP_RETURN_IF_ERROR(CheckGemm(args, a, b, c));
  if (symmetric && c.dim(0) != c.dim(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SymmetricGemm: c must be square, got shape ", ShapeString(c.shape())));
  }
  if (!d.defined() || d.shape() != c.shape() || d.dtype() != c.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GemmFrom: d must have c's shape and dtype, got ", ShapeString(d.shape()), " ",
        DTypeName(d.dtype()), " and ", ShapeString(c.shape()), " ", DTypeName(c.dtype())));
  }
  return absl::OkStatus();
}

absl::Status CheckConvert(const Tensor& src, const Tensor& dst) {
  if (!src.defined() || !dst.defined()) {
    return absl::InvalidArgumentError("Convert: tensor is not allocated");
  }
  if (!IsKnownDType(src.dtype()) || !IsKnownDType(dst.dtype()) ||
      (src.dtype() != DType::kF32 && dst.dtype() != DType::kF32)) {
    return absl::InvalidArgumentError(absl::StrCat("Convert: ", DTypeName(src.dtype()), " to ",
                                                   DTypeName(dst.dtype()),
                                                   "; one side must be fp32"));
  }
  OPTSTEP_RETURN_IF_ERROR(CheckSameSize("Convert", "dst", dst, "src", src));
  return CheckDistinct("Convert", "src", src, "dst", dst);
}

absl::Status CheckTranspose(const Tensor& src, const Tensor& dst) {
  OPTSTEP_RETURN_IF_ERROR(CheckMatrix("Transpose", "src", src));
  OPTSTEP_RETURN_IF_ERROR(CheckF32("Transpose", "dst", dst));
  OPTSTEP_RETURN_IF_ERROR(CheckShape("Transpose", "dst", dst, {src.dim(1), src.dim(0)}));
  return CheckDistinct("Transpose", "src", src, "dst", dst);
}

absl::Status CheckRowBlockCopy(const RowBlockCopy& copy, const Tensor& src, const Tensor& dst) {
  OPTSTEP_RETURN_IF_ERROR(CheckMatrix("CopyRowBlocks", "src", src));
  OPTSTEP_RETURN_IF_ERROR(CheckMatrix("CopyRowBlocks", "dst", dst));
  if (src.dim(1) != dst.dim(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyRowBlocks: src has ", src.dim(1), " columns but dst has ", dst.dim(1)));
  }
  if (copy.num_blocks < 0 || copy.block_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CopyRowBlocks: negative num_blocks ",
                                                   copy.num_blocks, " or block_rows ",
                                                   copy.block_rows));
  }
  OPTSTEP_RETURN_IF_ERROR(
      CheckBlocks("src", copy.src_first_row, copy.src_block_stride, copy, src.dim(0)));
  OPTSTEP_RETURN_IF_ERROR(
      CheckBlocks("dst", copy.dst_first_row, copy.dst_block_stride, copy, dst.dim(0)));
  return CheckDistinct("CopyRowBlocks", "src", src, "dst", dst);
}

absl::Status CheckAxisDot(const Tensor& a, const Tensor& b, const Tensor& out) {
  OPTSTEP_RETURN_IF_ERROR(CheckMatrix("AxisDot", "a", a));
  OPTSTEP_RETURN_IF_ERROR(CheckF32("AxisDot", "b", b));
  OPTSTEP_RETURN_IF_ERROR(CheckShape("AxisDot", "b", b, a.shape()));
  OPTSTEP_RETURN_IF_ERROR(CheckAxisVector("AxisDot", "out", out, a));
  OPTSTEP_RETURN_IF_ERROR(CheckDistinct("AxisDot", "out", out, "a", a));
  return CheckDistinct("AxisDot", "out", out, "b", b);
}

absl::Status CheckAxisScale(const Tensor& v, const Tensor& x) {
  OPTSTEP_RETURN_IF_ERROR(CheckMatrix("AxisScale", "x", x));
  OPTSTEP_RETURN_IF_ERROR(CheckAxisVector("AxisScale", "v", v, x));
  return CheckDistinct("AxisScale", "v", v, "x", x);
}

absl::Status CheckPermute(const Tensor& src, int axis, const std::vector<int64_t>& perm,
                          const Tensor& dst) {
  OPTSTEP_RETURN_IF_ERROR(CheckMatrix("Permute", "src", src));
  OPTSTEP_RETURN_IF_ERROR(CheckF32("Permute", "dst", dst));
  OPTSTEP_RETURN_IF_ERROR(CheckShape("Permute", "dst", dst, src.shape()));
  if (axis != 0 && axis != 1) {
    return absl::InvalidArgumentError(absl::StrCat("Permute: axis ", axis, " must be 0 or 1"));
  }
  const int64_t n = src.dim(axis);
  if (static_cast<int64_t>(perm.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("Permute: perm has ", perm.size(), " entries; axis ", axis, " has ", n));
  }
  std::vector<bool> seen(n, false);
  for (int64_t i : perm) {
    if (i < 0 || i >= n || seen[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("Permute: perm is not a permutation of [0, ", n, "): entry ", i));
    }
    seen[i] = true;
  }
  return CheckDistinct("Permute", "src", src, "dst", dst);
}

absl::Status CheckSymmetricEigh(const Tensor& a, float shift, const Tensor& eigenvalues,
                                const Tensor& eigenvectors) {
  constexpr absl::string_view kOp = "SymmetricEigh";
  OPTSTEP_RETURN_IF_ERROR(CheckMatrix(kOp, "a", a));
  if (a.dim(0) != a.dim(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SymmetricEigh: a must be square, got shape ", ShapeString(a.shape())));
  }
  if (!std::isfinite(shift)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SymmetricEigh: shift ", shift, " is not finite"));
  }
  OPTSTEP_RETURN_IF_ERROR(CheckF32(kOp, "eigenvalues", eigenvalues));
  OPTSTEP_RETURN_IF_ERROR(CheckShape(kOp, "eigenvalues", eigenvalues, {a.dim(0)}));
  OPTSTEP_RETURN_IF_ERROR(CheckF32(kOp, "eigenvectors", eigenvectors));
  OPTSTEP_RETURN_IF_ERROR(CheckShape(kOp, "eigenvectors", eigenvectors, a.shape()));
  OPTSTEP_RETURN_IF_ERROR(CheckDistinct(kOp, "a", a, "eigenvectors", eigenvectors));
  OPTSTEP_RETURN_IF_ERROR(CheckDistinct(kOp, "a", a, "eigenvalues", eigenvalues));
  return CheckDistinct(kOp, "eigenvalues", eigenvalues, "eigenvectors", eigenvectors);
}

absl::Status CheckQr(const Tensor& a, const Tensor& q) {
  OPTSTEP_RETURN_IF_ERROR(CheckMatrix("Qr", "a", a));
  if (a.dim(0) < a.dim(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Qr: a must have at least as many rows as columns, got shape ", ShapeString(a.shape())));
  }
  OPTSTEP_RETURN_IF_ERROR(CheckF32("Qr", "q", q));
  OPTSTEP_RETURN_IF_ERROR(CheckShape("Qr", "q", q, a.shape()));
  return CheckDistinct("Qr", "a", a, "q", q);
}

}  // namespace internal
}  // namespace optstep
