#ifndef OPTSTEP_TESTS_TESTING_SANITIZER_H_
#define OPTSTEP_TESTS_TESTING_SANITIZER_H_

// OPTSTEP_UNDER_SANITIZER is defined when the test is built with ASan or TSan (GCC defines
// __SANITIZE_*__, clang answers __has_feature). Checks of resident memory or address space mean
// nothing there: the sanitizers keep freed memory in quarantine and reserve shadow memory.

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define OPTSTEP_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define OPTSTEP_UNDER_SANITIZER 1
#endif
#endif

#endif  // OPTSTEP_TESTS_TESTING_SANITIZER_H_
