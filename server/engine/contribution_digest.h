#ifndef OPTSTEP_SERVER_ENGINE_CONTRIBUTION_DIGEST_H_
#define OPTSTEP_SERVER_ENGINE_CONTRIBUTION_DIGEST_H_

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/dtype.h"

namespace optstep {

// A digest of the gradient bytes a trainer sent to a step on this rank: which bytes of which
// parameter, in which dtype. A step that was applied (or committed) answers a trainer that sends
// it again as a replay (a retry) only when the two digests are equal, so that one caller's
// contribution is never answered with the result of another's (docs/security.md).
//
// Equal bytes give equal digests however they were chunked and however the network split the
// chunks: each parameter's bytes in one dtype are cut into aligned 8-byte words by their position
// (element offset times element size), each word is hashed with a key of its position, and the
// digest is the sum of the word hashes mod 2^64 (commutative: chunks may come in any order). A
// word that one chunk covers only in part (a chunk edge inside a word) is held until the other
// chunks complete it, so a word is hashed whole whichever chunks its bytes came in; a word still
// incomplete at the end (the last word of a parameter) is hashed with the bytes it has. This
// costs one 64x64->128-bit multiply per 8 bytes on the receiving thread, outside the session's
// lock (about 0.1 s per GB of gradients on one core, as much as copying them: bench:digest_bench),
// and memory only for the words cut by chunk edges, at most two per chunk. Hashing each element
// instead would need no held words but costs two to four times as many multiplies; hashing the
// assembled gradient buffer cannot tell the trainers of a REPLICATED step apart (they sum into one
// buffer).
//
// The word hash is wyhash's multiply-fold with keys drawn at random once per process, so a
// caller who does not know them cannot aim at a collision; two different contributions collide
// with a probability of about 2^-64. It is no cryptographic MAC, and the digest never leaves the
// process.
//
// Thread-compatible.
class ContributionDigest {
 public:
  // Adds the bytes of `param`'s gradient from element `offset` on, in `dtype`, given as `pieces`
  // (their concatenation, split anywhere).
  void Add(int param, DType dtype, int64_t offset, absl::Span<const absl::string_view> pieces);
  // Adds what `other` digested, as if its bytes had been added here.
  void Merge(const ContributionDigest& other);

  // Whether the two digested the same bytes at the same places (with a probability of a
  // collision of about 2^-64). False when either got a byte twice (overlapping chunks).
  bool SameAs(const ContributionDigest& other) const;
  // Whether some byte was added twice (only the words held in part can tell).
  bool overlapped() const { return overlapped_; }
  // The chunks added (Add), with those of the digests merged in.
  int64_t chunks() const { return chunks_; }

 private:
  struct WordKey {
    int param;
    DType dtype;
    uint64_t word;
    bool operator==(const WordKey& o) const {
      return param == o.param && dtype == o.dtype && word == o.word;
    }
    template <typename H>
    friend H AbslHashValue(H h, const WordKey& k) {
      return H::combine(std::move(h), k.param, k.dtype, k.word);
    }
  };
  struct HeldWord {
    uint64_t bytes = 0;  // byte j of the word in bits [8j, 8j + 8), zero where absent
    uint8_t mask = 0;    // bit j: byte j present
  };

  // Adds the bytes of `mask` in `bytes` to the word `key`: hashed at once when complete,
  // otherwise held until other bytes of it come.
  void AddWord(const WordKey& key, uint64_t bytes, uint8_t mask);
  // The digest with the held words hashed as they are.
  uint64_t Value() const;

  uint64_t sum_ = 0;  // of the complete words' hashes, mod 2^64
  absl::flat_hash_map<WordKey, HeldWord> held_;
  bool overlapped_ = false;
  int64_t chunks_ = 0;
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_CONTRIBUTION_DIGEST_H_
