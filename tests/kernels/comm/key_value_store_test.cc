// The KeyValueStore implementations: set/get, overwrite, waiting for a key that another thread
// (or writer) sets later, timeouts, odd keys and binary values; a wait abandoned (a rank lost).

#include "kernels/comm/key_value_store.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::StatusIs;

struct StoreFactory {
  std::string name;
  std::function<std::shared_ptr<KeyValueStore>()> create;
};

std::string TestDirectory() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  static int next = 0;
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/kv_store_", getpid(), "_", next++);
}

class KeyValueStoreTest : public ::testing::TestWithParam<StoreFactory> {
 protected:
  std::shared_ptr<KeyValueStore> store_ = GetParam().create();
};

TEST_P(KeyValueStoreTest, GetAnswersWhatSetStored) {
  OPTSTEP_ASSERT_OK(store_->Set("a", "1"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string value, store_->Get("a", absl::ZeroDuration()));
  EXPECT_EQ(value, "1");
}

TEST_P(KeyValueStoreTest, SetOverwrites) {
  OPTSTEP_ASSERT_OK(store_->Set("a", "first"));
  OPTSTEP_ASSERT_OK(store_->Set("a", "second"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string value, store_->Get("a", absl::Seconds(1)));
  EXPECT_EQ(value, "second");
}

TEST_P(KeyValueStoreTest, BinaryValuesAndOddKeysRoundTrip) {
  const std::string binary("\0\x01\xff\n/..\0end", 11);
  const std::vector<std::string> keys = {"session-1/gloo/0", "../escape", ".hidden", "a b%c",
                                         "k\n\xff"};
  for (const std::string& key : keys) OPTSTEP_ASSERT_OK(store_->Set(key, binary + key));
  for (const std::string& key : keys) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string value, store_->Get(key, absl::Seconds(1)));
    EXPECT_EQ(value, binary + key) << key;
  }
  OPTSTEP_ASSERT_OK(store_->Set("empty", ""));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string empty, store_->Get("empty", absl::Seconds(1)));
  EXPECT_EQ(empty, "");
}

TEST_P(KeyValueStoreTest, GetWaitsForALaterSet) {
  std::thread setter([store = store_] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(store->Set("late", "here").ok());
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> value = store_->Get("late", absl::Seconds(10));
  const absl::Duration elapsed = absl::Now() - start;
  setter.join();
  OPTSTEP_ASSERT_OK(value.status());
  EXPECT_EQ(*value, "here");
  EXPECT_GE(elapsed, absl::Milliseconds(90));
  EXPECT_LT(elapsed, absl::Seconds(5));
}

TEST_P(KeyValueStoreTest, GetOfAMissingKeyTimesOut) {
  const absl::Time start = absl::Now();
  EXPECT_THAT(store_->Get("never", absl::Milliseconds(150)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, "key 'never' was not set within"));
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_GE(elapsed, absl::Milliseconds(140));
  EXPECT_LT(elapsed, absl::Seconds(3));
  EXPECT_THAT(store_->Get("never", absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST_P(KeyValueStoreTest, ManyThreadsExchangeKeys) {
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t] {
      EXPECT_TRUE(store_->Set(absl::StrCat("rank/", t), absl::StrCat("value ", t)).ok());
      for (int other = 0; other < kThreads; ++other) {
        absl::StatusOr<std::string> value =
            store_->Get(absl::StrCat("rank/", other), absl::Seconds(10));
        EXPECT_TRUE(value.ok()) << value.status();
        if (value.ok()) {
          EXPECT_EQ(*value, absl::StrCat("value ", other));
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

INSTANTIATE_TEST_SUITE_P(
    Stores, KeyValueStoreTest,
    ::testing::Values(StoreFactory{"InMemory", [] { return NewInMemoryKeyValueStore(); }},
                      StoreFactory{"File", [] { return NewFileKeyValueStore(TestDirectory()); }},
                      // Never abandoned: a store as any other, its waits in slices.
                      StoreFactory{"Abandoning",
                                   [] {
                                     return NewAbandoningKeyValueStore(
                                         NewInMemoryKeyValueStore(),
                                         [] { return absl::OkStatus(); }, absl::Milliseconds(20));
                                   }}),
    [](const ::testing::TestParamInfo<StoreFactory>& info) { return info.param.name; });

// Two stores over one directory see each other's keys (as two processes would).
TEST(FileKeyValueStoreTest, StoresOverOneDirectoryShareKeys) {
  const std::string directory = TestDirectory();
  std::shared_ptr<KeyValueStore> writer = NewFileKeyValueStore(directory);
  std::shared_ptr<KeyValueStore> reader = NewFileKeyValueStore(directory);
  OPTSTEP_ASSERT_OK(writer->Set("id", std::string(128, '\x7f')));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string value, reader->Get("id", absl::Seconds(1)));
  EXPECT_EQ(value, std::string(128, '\x7f'));
}

TEST(FileKeyValueStoreTest, CreatesItsDirectory) {
  const std::string directory = absl::StrCat(TestDirectory(), "/nested/store");
  OPTSTEP_ASSERT_OK(NewFileKeyValueStore(directory)->Set("k", "v"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string value,
                               NewFileKeyValueStore(directory)->Get("k", absl::Seconds(1)));
  EXPECT_EQ(value, "v");
}

TEST(FileKeyValueStoreTest, RejectsEmptyAndOverlongKeys) {
  std::shared_ptr<KeyValueStore> store = NewFileKeyValueStore(TestDirectory());
  EXPECT_THAT(store->Set("", "v"), StatusIs(absl::StatusCode::kInvalidArgument, "empty key"));
  EXPECT_THAT(store->Get(std::string(300, 'k'), absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, "is 300 bytes"));
}

// A wait for a key that a lost rank would have set ends once the liveness says so, with its
// error, long before the timeout; a key that is set is answered without asking.
TEST(AbandoningKeyValueStoreTest, AWaitEndsWithTheErrorOnceAbandoned) {
  std::atomic<int> asked{0};
  std::atomic<bool> lost{false};
  std::shared_ptr<KeyValueStore> store = NewAbandoningKeyValueStore(
      NewInMemoryKeyValueStore(),
      [&] {
        ++asked;
        return lost ? absl::UnavailableError("rank 2 lost") : absl::OkStatus();
      },
      absl::Milliseconds(10));
  OPTSTEP_ASSERT_OK(store->Set("there", "v"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string value, store->Get("there", absl::Seconds(60)));
  EXPECT_EQ(value, "v");
  EXPECT_EQ(asked, 0);
  std::thread losing([&] {
    absl::SleepFor(absl::Milliseconds(100));
    lost = true;
  });
  EXPECT_THAT(store->Get("rank/2", absl::Hours(1)),
              StatusIs(absl::StatusCode::kUnavailable,
                       "the wait for key 'rank/2' was abandoned: rank 2 lost"));
  losing.join();
  EXPECT_GT(asked, 0);
}

TEST(AbandoningKeyValueStoreTest, AWaitNotAbandonedTimesOutWithItsWholeTimeout) {
  std::shared_ptr<KeyValueStore> store = NewAbandoningKeyValueStore(
      NewInMemoryKeyValueStore(), [] { return absl::OkStatus(); }, absl::Milliseconds(10));
  EXPECT_THAT(store->Get("never", absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, "was not set within 50ms"));
}

TEST(FileKeyValueStoreTest, UnwritableDirectoryIsAnError) {
  std::shared_ptr<KeyValueStore> store = NewFileKeyValueStore("/proc/optstep_no_such_dir");
  EXPECT_THAT(store->Set("k", "v"), StatusIs(absl::StatusCode::kUnavailable, "cannot create"));
}

}  // namespace
}  // namespace optstep
