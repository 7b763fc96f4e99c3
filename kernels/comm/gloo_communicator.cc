#include "kernels/comm/gloo_communicator.h"

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/context.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "kernels/comm/comm_validation.h"
#include "kernels/comm/gloo_status.h"
#include "kernels/comm/gloo_store.h"

namespace optstep {
namespace {

using ReduceFunction = void (*)(void*, const void*, const void*, size_t);

template <typename T>
ReduceFunction GlooReduceFunction(ReduceOp op) {
  // The casts pick gloo's (void*, const void*, const void*, size_t) overloads.
  return op == ReduceOp::kSum ? static_cast<ReduceFunction>(&gloo::sum<T>)
                              : static_cast<ReduceFunction>(&gloo::max<T>);
}

// Gloo writes to its sockets with writev(), which raises SIGPIPE when the peer has gone: by
// default that would kill this process instead of failing the collective with EPIPE.
// Checked at every Create (a system call), so that it holds however the process changed it.
void IgnoreSigpipe() {
  struct sigaction current;
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) == 0 &&
      current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

// What gloo's context is given for connecting, once every rank came: gloo waits five times that
// for a connection (its store keys are waited for until the deadline: GlooStore). The connect
// timeout, or the time left before the deadline if that is shorter; at least 1 ms (0 is gloo's
// "no timeout"). The pairs keep it as their default timeout: every wait of this communicator
// after the connection names its own (timeout_).
std::chrono::milliseconds ConnectTimeout(const CommunicatorOptions& options, absl::Time deadline) {
  absl::Duration bound = deadline - absl::Now();
  if (options.connect_timeout > absl::ZeroDuration()) {
    bound = std::min(bound, options.connect_timeout);
  }
  return std::max(absl::ToChronoMilliseconds(bound / 5), std::chrono::milliseconds(1));
}

// The rendezvous' first part: this rank says it came, then waits until every other rank did
// (or `deadline`).
absl::Status AwaitEveryRank(const CommunicatorOptions& options, absl::Time deadline,
                            const std::string& what) {
  const auto came = [&](int rank) { return absl::StrCat(options.prefix, "/came/", rank); };
  const absl::Status set = options.store->Set(came(options.rank), "");
  if (!set.ok()) return absl::Status(set.code(), absl::StrCat(what, ": ", set.message()));
  for (int r = 0; r < options.world_size; ++r) {
    if (r == options.rank) continue;
    const absl::Status got =
        options.store->Get(came(r), std::max(deadline - absl::Now(), absl::ZeroDuration()))
            .status();
    if (!got.ok()) {
      return absl::Status(got.code(), absl::StrCat(what, ": rendezvous: rank ", r,
                                                   " did not come: ", got.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    const CommunicatorOptions& options) {
  OPTSTEP_RETURN_IF_ERROR(internal::ValidateCommunicatorOptions(options));
  if (options.world_size < 2) {
    return absl::InvalidArgumentError(absl::StrCat("gloo communicator '", options.prefix,
                                                   "': world_size ", options.world_size,
                                                   " < 2 (use a local communicator)"));
  }
  IgnoreSigpipe();
  const absl::Time deadline = absl::Now() + options.timeout;
  const std::chrono::milliseconds timeout = absl::ToChronoMilliseconds(options.timeout);
  const std::string what = absl::StrCat("gloo communicator '", options.prefix, "' rank ",
                                        options.rank, " of ", options.world_size);

  std::shared_ptr<gloo::transport::Device> device;
  absl::Status status = internal::CallGloo(what, [&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    device = gloo::transport::tcp::CreateDevice(attr);
  });
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot open a TCP device on '", options.hostname, "': ", status.message()));
  }

  // Every rank may come late, up to the deadline; once all came, the connections are bounded by
  // the connect timeout: a peer that takes longer died.
  OPTSTEP_RETURN_IF_ERROR(AwaitEveryRank(options, deadline, what));
  auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
  context->setTimeout(ConnectTimeout(options, deadline));
  internal::GlooStore store(options.store, options.prefix, deadline);
  OPTSTEP_RETURN_IF_ERROR(internal::CallGloo(absl::StrCat(what, ": rendezvous"), [&] {
    context->connectFullMesh(store, device);
    context->setTimeout(timeout);
    // connectFullMesh returns once this rank's connections are up, while a peer may still be
    // completing its own: a rank that returned and closed at once would fail that peer's
    // rendezvous. The barrier returns only when every rank is connected.
    gloo::BarrierOptions barrier(context);
    barrier.setTimeout(
        std::max(absl::ToChronoMilliseconds(deadline - absl::Now()), std::chrono::milliseconds(1)));
    gloo::barrier(barrier);
  }));
  return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(
      options.rank, options.world_size, options.prefix, timeout, std::move(context)));
}

GlooCommunicator::GlooCommunicator(int rank, int world_size, std::string prefix,
                                   std::chrono::milliseconds timeout,
                                   std::shared_ptr<gloo::Context> context)
    : rank_(rank),
      world_size_(world_size),
      prefix_(std::move(prefix)),
      timeout_(timeout),
      context_(std::move(context)) {}

GlooCommunicator::~GlooCommunicator() {
  // Closing the connections and joining the device's loop thread must not throw either.
  internal::CallGloo(Describe(), [&] { context_.reset(); }).IgnoreError();
}

std::string GlooCommunicator::Describe() const {
  return absl::StrCat("gloo communicator '", prefix_, "' rank ", rank_, " of ", world_size_);
}

absl::Status GlooCommunicator::CheckUsable() const {
  if (broken_.ok()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      Describe(),
      ": unusable after an earlier error (the group must be re-created): ", broken_.message()));
}

absl::Status GlooCommunicator::Run(absl::string_view op, absl::FunctionRef<void()> fn) {
  absl::Status status = internal::CallGloo(absl::StrCat(Describe(), ": ", op), fn);
  if (!status.ok()) {
    broken_ = status;
    // Gloo closes this rank's connections itself after a timeout; after any other error close
    // them here, so that the ranks still waiting on this one fail now rather than at their
    // timeout.
    internal::CallGloo(Describe(), [&] { context_->closeConnections(); }).IgnoreError();
  }
  return status;
}

absl::Status GlooCommunicator::AllReduce(void* data, int64_t count, CommDType dtype, ReduceOp op) {
  OPTSTEP_RETURN_IF_ERROR(CheckUsable());
  OPTSTEP_RETURN_IF_ERROR(internal::ValidateAllReduce(data, count, dtype, op));
  if (count == 0) return absl::OkStatus();  // every rank has the same count: all skip
  return Run("all-reduce", [&] {
    gloo::AllreduceOptions options(context_);
    if (dtype == CommDType::kFloat32) {
      options.setOutput(static_cast<float*>(data), static_cast<size_t>(count));
      options.setReduceFunction(GlooReduceFunction<float>(op));
    } else {
      options.setOutput(static_cast<double*>(data), static_cast<size_t>(count));
      options.setReduceFunction(GlooReduceFunction<double>(op));
    }
    options.setTimeout(timeout_);
    gloo::allreduce(options);
  });
}

absl::Status GlooCommunicator::AllGatherV(const void* send, int64_t send_count, void* recv,
                                          const std::vector<int64_t>& recv_counts,
                                          CommDType dtype) {
  OPTSTEP_RETURN_IF_ERROR(CheckUsable());
  OPTSTEP_ASSIGN_OR_RETURN(
      const internal::GatherLayout layout,
      internal::ValidateAllGatherV(rank_, world_size_, send, send_count, recv, recv_counts, dtype));
  if (layout.total == 0) return absl::OkStatus();  // every rank has the same counts: all skip
  const size_t element_size = CommDTypeSize(dtype);
  uint8_t* out = static_cast<uint8_t*>(recv);
  // This rank's block goes in place first; Gloo then needs no input buffer.
  uint8_t* own = out + layout.offsets[rank_] * element_size;
  if (send_count > 0 && send != own) {
    std::memmove(own, send, static_cast<size_t>(send_count) * element_size);
  }
  std::vector<size_t> byte_counts(recv_counts.size());
  for (size_t r = 0; r < recv_counts.size(); ++r) {
    byte_counts[r] = static_cast<size_t>(recv_counts[r]) * element_size;
  }
  return Run("all-gather-v", [&] {
    gloo::AllgathervOptions options(context_);
    options.setOutput(out, std::move(byte_counts));
    options.setTimeout(timeout_);
    gloo::allgatherv(options);
  });
}

absl::Status GlooCommunicator::Broadcast(void* data, int64_t count, CommDType dtype, int root) {
  OPTSTEP_RETURN_IF_ERROR(CheckUsable());
  OPTSTEP_RETURN_IF_ERROR(internal::ValidateBroadcast(data, count, dtype, root, world_size_));
  if (count == 0) return absl::OkStatus();
  return Run("broadcast", [&] {
    gloo::BroadcastOptions options(context_);
    options.setOutput(static_cast<uint8_t*>(data),
                      static_cast<size_t>(count) * CommDTypeSize(dtype));
    options.setRoot(root);
    options.setTimeout(timeout_);
    gloo::broadcast(options);
  });
}

absl::Status GlooCommunicator::RingShift(const void* send, int64_t send_count, void* recv,
                                         int64_t recv_count, CommDType dtype) {
  OPTSTEP_RETURN_IF_ERROR(CheckUsable());
  OPTSTEP_RETURN_IF_ERROR(internal::ValidateRingShift(send, send_count, recv, recv_count, dtype));
  const size_t element_size = CommDTypeSize(dtype);
  const int next = (rank_ + 1) % world_size_;
  const int previous = (rank_ + world_size_ - 1) % world_size_;
  return Run("ring shift", [&] {
    // Every rank issues the same collectives in the same order, so the slot is the same on all.
    const uint64_t slot = context_->nextSlot();
    // Gloo's buffers are not const; a send only reads.
    std::unique_ptr<gloo::transport::UnboundBuffer> out;
    std::unique_ptr<gloo::transport::UnboundBuffer> in;
    if (send_count > 0) {
      out = context_->createUnboundBuffer(const_cast<void*>(send),
                                          static_cast<size_t>(send_count) * element_size);
      out->send(next, slot);
    }
    if (recv_count > 0) {
      in = context_->createUnboundBuffer(recv, static_cast<size_t>(recv_count) * element_size);
      in->recv(previous, slot);
    }
    if (in != nullptr) in->waitRecv(timeout_);
    if (out != nullptr) out->waitSend(timeout_);
  });
}

absl::Status GlooCommunicator::Barrier() {
  OPTSTEP_RETURN_IF_ERROR(CheckUsable());
  return Run("barrier", [&] {
    gloo::BarrierOptions options(context_);
    options.setTimeout(timeout_);
    gloo::barrier(options);
  });
}

}  // namespace optstep
