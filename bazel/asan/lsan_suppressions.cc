// LeakSanitizer suppressions for --config=asan, compiled into every binary of that config
// (.bazelrc: --custom_malloc); LSan reads them from __lsan_default_suppressions, so no
// LSAN_OPTIONS path is needed. Each entry is a leak inside a library Debian ships, with the
// reason; leaks in the project's code are fixed, never listed here.
// - libcares: gRPC's DNS resolver (c-ares) keeps per-channel allocations that gRPC's shutdown
//   does not free (seen: 15 objects of 10 bytes from libcares in client_test, whose channels
//   resolve "localhost").
// - libgloo: Gloo's tcp::CreateDevice resolves its host with getaddrinfo and never frees the
//   result (seen: 64 bytes in communicator_factory_test).
// - libomp: the OpenMP runtime's per-thread descriptors of its worker pool, which it keeps until
//   the process ends (seen: 4 objects of 1440 bytes allocated by libomp alone in the CPU device
//   tests, with no frame of ours).

extern "C" const char* __lsan_default_suppressions() {
  return "leak:libcares.so\nleak:libgloo.so\nleak:libomp.so\n";
}
