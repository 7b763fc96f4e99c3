#include "server/engine/contribution_digest.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace optstep {
namespace {

// `bytes` of a parameter from element 0, in fp32, as chunks cut at the element offsets `cuts`,
// each chunk's bytes split into pieces of at most `piece` bytes (the network's slices), the
// chunks added in the order `order` gives (indices into the chunks).
ContributionDigest Chunked(const std::string& bytes, int param, const std::vector<int64_t>& cuts,
                           size_t piece, const std::vector<size_t>& order) {
  std::vector<std::pair<int64_t, int64_t>> chunks;  // [begin, end) elements
  int64_t at = 0;
  for (int64_t cut : cuts) {
    chunks.emplace_back(at, cut);
    at = cut;
  }
  chunks.emplace_back(at, static_cast<int64_t>(bytes.size() / 4));
  ContributionDigest digest;
  for (size_t i : order) {
    const auto [begin, end] = chunks[i];
    absl::string_view chunk = absl::string_view(bytes).substr(begin * 4, (end - begin) * 4);
    std::vector<absl::string_view> pieces;
    for (size_t b = 0; b < chunk.size(); b += piece) pieces.push_back(chunk.substr(b, piece));
    digest.Add(param, DType::kF32, begin, pieces);
  }
  return digest;
}

std::vector<size_t> InOrder(size_t n) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  return order;
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 random(seed);
  std::string bytes(n, '\0');
  for (char& b : bytes) b = static_cast<char>(random());
  return bytes;
}

TEST(ContributionDigestTest, EqualBytesAreEqualHoweverChunkedSplitAndOrdered) {
  const std::string bytes = RandomBytes(4 * 1001, 1);  // 1001 fp32 elements: a last half word
  const ContributionDigest whole = Chunked(bytes, 0, {}, bytes.size(), {0});
  std::mt19937 random(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> cuts;
    for (int64_t e = 1 + random() % 50; e < 1001; e += 1 + random() % 97) cuts.push_back(e);
    std::vector<size_t> order = InOrder(cuts.size() + 1);
    std::shuffle(order.begin(), order.end(), random);
    const size_t piece = 1 + random() % 64;
    EXPECT_TRUE(whole.SameAs(Chunked(bytes, 0, cuts, piece, order))) << "trial " << trial;
  }
}

TEST(ContributionDigestTest, MergedPartsEqualTheWhole) {
  const std::string bytes = RandomBytes(4 * 37, 2);
  const ContributionDigest whole = Chunked(bytes, 3, {}, bytes.size(), {0});
  // Odd cuts leave words cut in two, held by each part until the merge completes them.
  ContributionDigest first = Chunked(bytes.substr(0, 4 * 13), 3, {5}, 3, {1, 0});
  ContributionDigest second;
  const absl::string_view rest = absl::string_view(bytes).substr(4 * 13);
  second.Add(3, DType::kF32, 13, {rest.substr(0, 9), rest.substr(9)});
  first.Merge(second);
  EXPECT_TRUE(whole.SameAs(first));
  EXPECT_FALSE(whole.overlapped());
}

TEST(ContributionDigestTest, AnyDifferentByteParamDtypeOrPlaceDiffers) {
  const std::string bytes = RandomBytes(4 * 64, 3);
  const ContributionDigest digest = Chunked(bytes, 0, {17}, 1000, {0, 1});
  for (size_t at : {size_t{0}, size_t{5}, size_t{67}, bytes.size() - 1}) {
    std::string changed = bytes;
    changed[at] ^= 0x01;
    EXPECT_FALSE(digest.SameAs(Chunked(changed, 0, {17}, 1000, {0, 1}))) << "byte " << at;
  }
  EXPECT_FALSE(digest.SameAs(Chunked(bytes, 1, {17}, 1000, {0, 1})));  // another parameter
  ContributionDigest as_bf16;
  as_bf16.Add(0, DType::kBF16, 0, {bytes});
  EXPECT_FALSE(digest.SameAs(as_bf16));
  ContributionDigest shifted;  // the same bytes one element further
  shifted.Add(0, DType::kF32, 1, {bytes});
  EXPECT_FALSE(digest.SameAs(shifted));
  // Two values swapped between two places.
  std::string swapped = bytes;
  std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 64);
  EXPECT_FALSE(digest.SameAs(Chunked(swapped, 0, {17}, 1000, {0, 1})));
  EXPECT_FALSE(digest.SameAs(ContributionDigest()));
  EXPECT_FALSE(digest.SameAs(Chunked(bytes.substr(0, 4 * 63), 0, {17}, 1000, {0, 1})));
}

TEST(ContributionDigestTest, BytesSentTwiceAreNeverTheSame) {
  const std::string bytes = RandomBytes(4 * 9, 4);
  const ContributionDigest once = Chunked(bytes, 0, {3}, 1000, {0, 1});
  // Elements [0, 3) twice, then [3, 9): the held word [2, 4) gets element 2 twice.
  ContributionDigest twice = Chunked(bytes, 0, {3}, 1000, {0, 0, 1});
  EXPECT_TRUE(twice.overlapped());
  EXPECT_FALSE(once.SameAs(twice));
  EXPECT_FALSE(twice.SameAs(twice));
  // [0, 3) again after [3, 9) completed that word: the extra words change the sum.
  EXPECT_FALSE(once.SameAs(Chunked(bytes, 0, {3}, 1000, {0, 1, 0})));
  // A whole chunk twice changes the sum.
  ContributionDigest whole_twice = Chunked(bytes, 0, {2}, 1000, {0, 1, 0});
  EXPECT_FALSE(Chunked(bytes, 0, {2}, 1000, {0, 1}).SameAs(whole_twice));
}

}  // namespace
}  // namespace optstep
