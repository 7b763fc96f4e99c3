// ThreadSanitizer suppressions for --config=tsan, compiled into every binary of that config with
// bazel/tsan/absl_mutex_annotations.cc (TSan reads them from __tsan_default_suppressions, so no
// TSAN_OPTIONS path is needed).
//
// Each entry is a library that Debian ships without TSan instrumentation. TSan sees the calls
// such a library makes to intercepted functions (memcpy, recvmsg, pthread_cond_*) but not the
// atomics and lock-free queues that order them, so it reports races between two accesses that
// both lie inside the library. `called_from_lib` makes TSan ignore the intercepted calls made
// from that library; our own code stays fully checked.
// - libgrpc, libgrpc++, libgpr: gRPC hands received slices between its poller threads through
//   lock-free queues (seen: recvmsg on one thread, grpc_slice_copy's memcpy on another).
// - libgloo: Gloo's tcp transport signals and destroys its buffers' condition variables from its
//   own threads (seen: pthread_cond_broadcast in UnboundBuffer::signalException against
//   pthread_cond_destroy in ~UnboundBuffer after a lost peer), and hands an exception from its
//   thread to the caller's (seen: malloc of a runtime_error under gloo on one thread, its free
//   on the caller's), hence also `race:gloo::` and the exception's release and destructor on
//   our side (GlooCommunicator's destructor drops what Gloo threw), and CallGloo, which catches
//   it (its vptr read on the catching thread; CallGloo runs nothing of ours but the Gloo call).
// - libomp: its allocator clears freed blocks (memset in __kmp_free) on whichever thread frees
//   them, ordered by its own uninstrumented locks.
// - libabsl_status: a Status received through gRPC is compared (memcmp) on one thread and was
//   copied (memcpy) on another, both inside the library, ordered by gRPC's queues.
// - libabsl_graphcycles_internal: Abseil's deadlock detector moves its graph's nodes (memmove
//   in GraphCycles::RemoveNode) under its own uninstrumented lock, from any thread that
//   destroys a mutex (seen: a SerialExecutor thread's exit in session_failure_test).
// - libdnnl: oneDNN's primitive cache is shared by every engine of the process; a rank's
//   thread takes the read lock of a cache entry another rank's thread created, published to it
//   through oneDNN's own atomics (seen: pthread_rwlock_rdlock from libdnnl against the malloc
//   of that lock under DnnlGemm::Run, two ranks' Newton-Schulz GEMMs of the same shape).

extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libgrpc.so\n"
         "called_from_lib:libgrpc++.so\n"
         "called_from_lib:libgpr.so\n"
         "called_from_lib:libgloo.so\n"
         "race:gloo::\n"
         "race:std::runtime_error::~runtime_error\n"
         "race:std::__exception_ptr::exception_ptr::_M_release\n"
         "race:optstep::internal::CallGloo\n"
         "called_from_lib:libabsl_status.so\n"
         "called_from_lib:libomp.so\n"
         "called_from_lib:libdnnl.so\n"
         "called_from_lib:libabsl_graphcycles_internal.so\n";
}
