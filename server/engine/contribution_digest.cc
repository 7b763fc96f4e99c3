#include "server/engine/contribution_digest.h"

#include <cstring>
#include <random>

namespace optstep {
namespace {

constexpr uint64_t kPhi = 0x9e3779b97f4a7c15ull;  // steps the position key from word to word
constexpr uint8_t kWholeWord = 0xff;

// The keys of this process, drawn once.
struct Keys {
  uint64_t bytes;     // folded into every word
  uint64_t position;  // folded into every (param, dtype)
  uint64_t held;      // folded into the words hashed in part
};

uint64_t Draw(std::random_device& random) {
  return (static_cast<uint64_t>(random()) << 32) ^ random();
}

const Keys& ProcessKeys() {
  static const Keys keys = [] {
    std::random_device random;
    return Keys{Draw(random), Draw(random), Draw(random)};
  }();
  return keys;
}

// splitmix64's finaliser.
uint64_t Mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// wyhash's multiply-fold: the two halves of the 128-bit product, xored.
inline uint64_t Mum(uint64_t a, uint64_t b) {
  const unsigned __int128 product = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(product) ^ static_cast<uint64_t>(product >> 64);
}

// The key of word 0 of `param`'s bytes in `dtype`; word w's is this plus w * kPhi.
uint64_t BaseKey(int param, DType dtype) {
  return Mix(ProcessKeys().position ^ ((static_cast<uint64_t>(static_cast<uint32_t>(param)) << 8) |
                                       static_cast<uint64_t>(dtype)));
}

uint64_t WordHash(uint64_t base, uint64_t word, uint64_t bytes) {
  return Mum(bytes ^ ProcessKeys().bytes, base + word * kPhi);
}

}  // namespace

void ContributionDigest::Add(int param, DType dtype, int64_t offset,
                             absl::Span<const absl::string_view> pieces) {
  ++chunks_;
  const uint64_t base = BaseKey(param, dtype);
  const uint64_t key_bytes = ProcessKeys().bytes;
  uint64_t pos = static_cast<uint64_t>(offset) * DTypeSize(dtype);  // of the next byte
  char staged[8] = {};  // the current word's bytes while it is cut by a piece edge
  uint8_t mask = 0;
  uint64_t sum = 0;
  for (absl::string_view piece : pieces) {
    const char* p = piece.data();
    size_t n = piece.size();
    while (n > 0) {
      if (pos % 8 == 0 && n >= 8) {
        // Whole words straight from the piece.
        const size_t words = n / 8;
        uint64_t key = base + (pos / 8) * kPhi;
        for (size_t i = 0; i < words; ++i, p += 8, key += kPhi) {
          uint64_t x;
          std::memcpy(&x, p, 8);
          sum += Mum(x ^ key_bytes, key);
        }
        pos += words * 8;
        n -= words * 8;
        continue;
      }
      const unsigned j = pos % 8;
      staged[j] = *p++;
      mask |= static_cast<uint8_t>(1u << j);
      --n;
      if (++pos % 8 == 0) {
        uint64_t x;
        std::memcpy(&x, staged, 8);
        AddWord(WordKey{param, dtype, pos / 8 - 1}, x, mask);
        std::memset(staged, 0, sizeof(staged));
        mask = 0;
      }
    }
  }
  if (mask != 0) {
    uint64_t x;
    std::memcpy(&x, staged, 8);
    AddWord(WordKey{param, dtype, pos / 8}, x, mask);
  }
  sum_ += sum;
}

void ContributionDigest::AddWord(const WordKey& key, uint64_t bytes, uint8_t mask) {
  auto held = held_.find(key);
  if (held == held_.end()) {
    if (mask == kWholeWord) {
      sum_ += WordHash(BaseKey(key.param, key.dtype), key.word, bytes);
    } else {
      held_.emplace(key, HeldWord{bytes, mask});
    }
    return;
  }
  HeldWord& word = held->second;
  if ((word.mask & mask) != 0) overlapped_ = true;
  word.bytes |= bytes;
  word.mask |= mask;
  if (word.mask != kWholeWord) return;
  sum_ += WordHash(BaseKey(key.param, key.dtype), key.word, word.bytes);
  held_.erase(held);
}

void ContributionDigest::Merge(const ContributionDigest& other) {
  sum_ += other.sum_;
  chunks_ += other.chunks_;
  overlapped_ = overlapped_ || other.overlapped_;
  for (const auto& [key, word] : other.held_) AddWord(key, word.bytes, word.mask);
}

uint64_t ContributionDigest::Value() const {
  uint64_t value = sum_;
  for (const auto& [key, word] : held_) {
    value += WordHash(BaseKey(key.param, key.dtype), key.word,
                      word.bytes ^ Mix(ProcessKeys().held ^ word.mask));
  }
  return value;
}

bool ContributionDigest::SameAs(const ContributionDigest& other) const {
  return !overlapped_ && !other.overlapped_ && Value() == other.Value();
}

}  // namespace optstep
