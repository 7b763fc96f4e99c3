// DnnlGemm: oneDNN's bf16 matmul primitive behind the CPU device's `medium` GEMMs.

#include "kernels/cpu/dnnl_gemm.h"

#include <omp.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace optstep {
namespace internal {
namespace {

using dnnl::memory;

// Row-major {rows, cols} of op(X), where X is stored {rows, cols} or, transposed, {cols, rows}.
memory::desc OperandDesc(int64_t rows, int64_t cols, bool transposed, memory::data_type type) {
  const memory::dims strides = transposed ? memory::dims{1, rows} : memory::dims{cols, 1};
  return memory::desc({rows, cols}, type, strides);
}

// Restores the calling thread's OpenMP thread count (oneDNN forks omp_get_max_threads()).
class OmpThreads {
 public:
  explicit OmpThreads(int threads) : saved_(omp_get_max_threads()) { omp_set_num_threads(threads); }
  ~OmpThreads() { omp_set_num_threads(saved_); }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  const int saved_;
};

}  // namespace

struct DnnlGemm::Handles {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

struct DnnlGemm::Primitive {
  memory::desc a, b, c;
  dnnl::matmul matmul;
  std::string implementation;
};

DnnlGemm::DnnlGemm() : handles_(std::make_unique<Handles>()) {}
DnnlGemm::~DnnlGemm() = default;

absl::Status DnnlGemm::Run(int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                           float alpha, const uint16_t* a, const uint16_t* b, float beta,
                           float* c) {
  try {
    const Key key{m, n, k, ta, tb, alpha, beta};
    auto it = primitives_.find(key);
    if (it == primitives_.end()) {
      if (primitives_.size() >= kMaxPrimitives) primitives_.clear();
      auto p = std::make_unique<Primitive>();
      p->a = OperandDesc(m, k, ta, memory::data_type::bf16);
      p->b = OperandDesc(k, n, tb, memory::data_type::bf16);
      p->c = OperandDesc(m, n, false, memory::data_type::f32);
      dnnl::primitive_attr attr;
      if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
      if (beta != 0.0f) {
        dnnl::post_ops ops;
        ops.append_sum(beta);
        attr.set_post_ops(ops);
      }
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p->a, p->b, p->c), attr, handles_->engine);
      p->implementation = pd.impl_info_str();
      p->matmul = dnnl::matmul(pd);
      it = primitives_.emplace(key, std::move(p)).first;
    }
    Primitive& p = *it->second;
    dnnl::engine& engine = handles_->engine;
    memory am(p.a, engine, const_cast<uint16_t*>(a));
    memory bm(p.b, engine, const_cast<uint16_t*>(b));
    memory cm(p.c, engine, c);
    {
      OmpThreads omp(threads);
      p.matmul.execute(handles_->stream,
                       {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      handles_->stream.wait();
    }
    last_implementation_ = p.implementation;
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("Gemm: oneDNN bf16 matmul ", m, "x", n, "x", k, " (ta ",
                                            ta, ", tb ", tb, ") failed: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace optstep
