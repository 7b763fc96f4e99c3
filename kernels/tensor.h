#ifndef OPTSTEP_KERNELS_TENSOR_H_
#define OPTSTEP_KERNELS_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/dtype.h"

namespace optstep {

using Shape = std::vector<int64_t>;

// The most dimensions a caller's tensor may have. A shape is copied into every tensor made of it
// (master, gradient, each state), none of which budgets count: a shape of millions of ones in
// one message held hundreds of MB per session outside any budget.
inline constexpr int kMaxDims = 64;

// Number of elements of `shape` (1 for a scalar).
int64_t NumElements(const Shape& shape);
// "[4096, 1024]".
std::string ShapeString(const Shape& shape);

// A dense row-major tensor in one device's memory, owning it. Created only by Device::Allocate;
// its memory is released through the deleter the device gave it. Move-only.
// Thread-compatible.
class Tensor {
 public:
  using Deleter = std::function<void(void*)>;

  Tensor() = default;
  Tensor(DType dtype, Shape shape, void* data, Deleter deleter)
      : dtype_(dtype),
        shape_(std::move(shape)),
        numel_(NumElements(shape_)),
        data_(data),
        deleter_(std::move(deleter)) {}
  ~Tensor() { Reset(); }

  Tensor(Tensor&& other) noexcept { *this = std::move(other); }
  Tensor& operator=(Tensor&& other) noexcept {
    if (this != &other) {
      Reset();
      dtype_ = other.dtype_;
      shape_ = std::move(other.shape_);
      numel_ = other.numel_;
      data_ = other.data_;
      deleter_ = std::move(other.deleter_);
      other.data_ = nullptr;
      other.numel_ = 0;
      other.shape_.clear();
    }
    return *this;
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  bool defined() const { return data_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return numel_; }
  size_t bytes() const { return static_cast<size_t>(numel_) * DTypeSize(dtype_); }

  // Device memory: dereference only on the device that allocated the tensor.
  void* data() { return data_; }
  const void* data() const { return data_; }
  float* f32() { return static_cast<float*>(data_); }
  const float* f32() const { return static_cast<const float*>(data_); }

 private:
  void Reset() {
    if (data_ != nullptr && deleter_) deleter_(data_);
    data_ = nullptr;
  }

  DType dtype_ = DType::kF32;
  Shape shape_;
  int64_t numel_ = 0;
  void* data_ = nullptr;
  Deleter deleter_;
};

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_TENSOR_H_
