// Writes the sample two-rank checkpoint of checkpoint_test_util to <root>/<name> and prints,
// as JSON on stdout, every tensor it wrote: {"<key>": {"dtype", "shape", "values"}}. The
// Python test reads the shards with the safetensors package and compares against this.
//
//   write_sample_checkpoint <root> <name>

#include <cstdint>
#include <cstring>
#include <iostream>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/checkpoint/checkpoint_test_util.h"

int main(int argc, char** argv) {
  using optstep::StateTensor;
  if (argc != 3) {
    std::cerr << "usage: write_sample_checkpoint <root> <name>\n";
    return 64;
  }
  const std::vector<int> owners = {0, 1, 1, 0};
  const auto shards = optstep::testutil::SampleShards(2, owners);
  const absl::Status status = optstep::testutil::WriteCheckpoint(
      argv[1], argv[2], optstep::testutil::SampleManifest(2, owners), shards);
  if (!status.ok()) {
    std::cerr << "write_sample_checkpoint: " << status << "\n";
    return 1;
  }
  nlohmann::json out = nlohmann::json::object();
  for (const auto& shard : shards) {
    for (const auto& t : shard) {
      nlohmann::json values = nlohmann::json::array();
      const bool i64 = t.type == StateTensor::Type::kI64;
      for (size_t at = 0; at < t.bytes.size(); at += i64 ? 8 : 4) {
        if (i64) {
          int64_t v;
          std::memcpy(&v, t.bytes.data() + at, 8);
          values.push_back(v);
        } else {
          float v;
          std::memcpy(&v, t.bytes.data() + at, 4);
          values.push_back(v);
        }
      }
      out[t.key] = {{"dtype", i64 ? "I64" : "F32"}, {"shape", t.shape}, {"values", values}};
    }
  }
  std::cout << out.dump() << "\n";
  return 0;
}
