// SharedMemory: a segment created here is seen, byte for byte, by whoever opens its path; its size
// is sealed, so no process that opens it can shrink it under another's reads; Open refuses a file
// of another size, and one that is not sealed.

#include "base/shared_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

TEST(SharedMemoryTest, WhatOneMappingWritesTheOtherReads) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto created, SharedMemory::Create(1 << 20, "test"));
  EXPECT_EQ(created->size(), 1u << 20);
  EXPECT_EQ(created->data()[12345], 0);  // zero-filled
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto opened, SharedMemory::Open(created->path(), 1 << 20));
  std::memcpy(created->data() + 100, "gradients", 9);
  EXPECT_EQ(std::string(opened->data() + 100, 9), "gradients");
  std::memcpy(opened->data() + 4096, "values", 6);
  EXPECT_EQ(std::string(created->data() + 4096, 6), "values");
}

TEST(SharedMemoryTest, NoOpenerCanChangeItsSize) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto created, SharedMemory::Create(8192, "test"));
  const int fd = open(created->path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  EXPECT_NE(ftruncate(fd, 4096), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(fd, 16384), 0);
  close(fd);
  created->data()[8191] = 1;  // still mapped whole: no SIGBUS
}

TEST(SharedMemoryTest, OpenRefusesAnotherSizeAndUnsealedFiles) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto created, SharedMemory::Create(8192, "test"));
  EXPECT_THAT(SharedMemory::Open(created->path(), 4096).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a sealed segment of 4096 bytes"));
  const std::string file = std::string(getenv("TEST_TMPDIR")) + "/plain";
  FILE* plain = fopen(file.c_str(), "w");
  ASSERT_NE(plain, nullptr);
  ASSERT_EQ(ftruncate(fileno(plain), 8192), 0);
  fclose(plain);
  EXPECT_THAT(SharedMemory::Open(file, 8192).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a sealed segment"));
  EXPECT_THAT(SharedMemory::Open(file + ".missing", 8192).status(),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(SharedMemoryTest, ASegmentOfNoBytesIsRefused) {
  EXPECT_THAT(SharedMemory::Create(0, "test").status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace optstep
