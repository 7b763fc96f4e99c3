// DnnlGemm: oneDNN's bf16 matmul primitive behind the CPU device's `medium` GEMMs.

#include "kernels/cpu/dnnl_gemm.h"

#include <omp.h>

#include <algorithm>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace optstep {
namespace internal {
namespace {

using dnnl::memory;

// Row-major {rows, cols} of op(X), where X is stored {rows, cols} or, transposed, {cols, rows},
// with leading dimension ld.
memory::desc OperandDesc(int64_t rows, int64_t cols, bool transposed, int64_t ld,
                         memory::data_type type) {
  const memory::dims strides = transposed ? memory::dims{1, ld} : memory::dims{ld, 1};
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

absl::Status ProductError(const DnnlProduct& p, const dnnl::error& e) {
  return absl::InternalError(absl::StrCat("Gemm: oneDNN bf16 matmul ", p.m, "x", p.n, "x", p.k,
                                          " (ta ", p.ta, ", tb ", p.tb, ", ldc ", p.ldc,
                                          ") failed: ", e.what()));
}

}  // namespace

struct DnnlGemm::Handles {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

struct DnnlGemm::Primitive {
  memory::desc a, b, c;
  dnnl::engine engine;
  dnnl::matmul matmul;
  std::string implementation;
  memory::desc scratchpad;  // single-threaded primitives: the caller's scratchpad (RunOnThisThread)
};

namespace {

// The arguments of one execution: the operands, and where given a scratchpad.
std::unordered_map<int, memory> ExecArgs(const DnnlGemm::Primitive& prim, const uint16_t* a,
                                         const uint16_t* b, void* c) {
  return {{DNNL_ARG_SRC, memory(prim.a, prim.engine, const_cast<uint16_t*>(a))},
          {DNNL_ARG_WEIGHTS, memory(prim.b, prim.engine, const_cast<uint16_t*>(b))},
          {DNNL_ARG_DST, memory(prim.c, prim.engine, c)}};
}

}  // namespace

DnnlGemm::DnnlGemm(size_t max_primitives)
    : handles_(std::make_unique<Handles>()), max_primitives_(max_primitives) {}
DnnlGemm::~DnnlGemm() = default;

DnnlGemm::Key DnnlGemm::KeyOf(const DnnlProduct& p, bool single_threaded) {
  return Key{p.ta,  p.tb,  p.m,     p.n,    p.k,      p.lda,
             p.ldb, p.ldc, p.alpha, p.beta, p.c_bf16, single_threaded};
}

void DnnlGemm::MakeRoom(size_t missing) {
  if (missing > 0 && primitives_.size() + missing > max_primitives_) primitives_.clear();
}

std::shared_ptr<const DnnlGemm::Primitive> DnnlGemm::Find(const DnnlProduct& p,
                                                          bool single_threaded) {
  const Key key = KeyOf(p, single_threaded);
  auto it = primitives_.find(key);
  if (it != primitives_.end()) return it->second;
  auto made = std::make_shared<Primitive>();
  made->a = OperandDesc(p.m, p.k, p.ta, p.lda, memory::data_type::bf16);
  made->b = OperandDesc(p.k, p.n, p.tb, p.ldb, memory::data_type::bf16);
  made->c = OperandDesc(p.m, p.n, false, p.ldc,
                        p.c_bf16 ? memory::data_type::bf16 : memory::data_type::f32);
  made->engine = handles_->engine;
  dnnl::primitive_attr attr;
  // α and β are compiled in: oneDNN 2.x's brgemm matmul refuses runtime output scales (it fell
  // back to its slower gemm:jit). Newton–Schulz's α and β change together from step to step, so
  // a runtime α would not spare primitives.
  if (p.alpha != 1.0f) attr.set_output_scales(0, {p.alpha});
  if (p.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(p.beta);
    attr.set_post_ops(ops);
  }
  // oneDNN plans a primitive for the OpenMP thread count at its creation.
  const OmpThreads omp(single_threaded ? 1 : omp_get_max_threads());
  if (single_threaded) attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(made->a, made->b, made->c), attr,
                                  handles_->engine);
  made->implementation = pd.impl_info_str();
  if (single_threaded) made->scratchpad = pd.scratchpad_desc();
  made->matmul = dnnl::matmul(pd);
  ++primitives_created_;
  return primitives_.emplace(key, std::move(made)).first->second;
}

absl::Status DnnlGemm::Run(int threads, const DnnlProduct& p, const uint16_t* a, const uint16_t* b,
                           void* c) {
  try {
    MakeRoom(primitives_.count(KeyOf(p, false)) == 0 ? 1 : 0);
    const std::shared_ptr<const Primitive> prim = Find(p, false);
    {
      OmpThreads omp(threads);
      prim->matmul.execute(handles_->stream, ExecArgs(*prim, a, b, c));
      handles_->stream.wait();
    }
    last_implementation_ = prim->implementation;
  } catch (const dnnl::error& e) {
    return ProductError(p, e);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::shared_ptr<const DnnlGemm::Primitive>>>
DnnlGemm::PrepareSingleThreaded(const std::vector<DnnlProduct>& products) {
  std::set<Key> missing;
  for (const DnnlProduct& p : products) {
    const Key key = KeyOf(p, true);
    if (primitives_.count(key) == 0) missing.insert(key);
  }
  MakeRoom(missing.size());
  std::vector<std::shared_ptr<const Primitive>> prepared;
  std::vector<std::string> names;
  for (const DnnlProduct& p : products) {
    try {
      prepared.push_back(Find(p, true));
    } catch (const dnnl::error& e) {
      return ProductError(p, e);
    }
    const std::string& name = prepared.back()->implementation;
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  last_implementation_ = absl::StrJoin(names, ", ");
  return prepared;
}

absl::Status DnnlGemm::RunOnThisThread(const Primitive& prim, const uint16_t* a, const uint16_t* b,
                                       void* c) {
  // Grown to the largest scratchpad this thread has needed, kept for the thread's life.
  thread_local std::vector<char> scratchpad;
  try {
    if (scratchpad.size() < prim.scratchpad.get_size()) {
      scratchpad.resize(prim.scratchpad.get_size());
    }
    dnnl::stream stream(prim.engine);
    std::unordered_map<int, memory> args = ExecArgs(prim, a, b, c);
    if (prim.scratchpad.get_size() > 0) {
      args.emplace(DNNL_ARG_SCRATCHPAD, memory(prim.scratchpad, prim.engine, scratchpad.data()));
    }
    prim.matmul.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& e) {
    return absl::InternalError(
        absl::StrCat("Gemm: oneDNN bf16 matmul on one thread failed: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace optstep
