#include "checkpoint/checkpoint_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/file_util.h"

namespace optstep {
namespace {

size_t StagingSize(const CheckpointIoOptions& options) {
  return std::max<size_t>(options.staging_bytes, 4096);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    absl::string_view root, absl::string_view name, const CheckpointIoOptions& options) {
  OPTSTEP_RETURN_IF_ERROR(ValidateCheckpointName(name));
  return OpenDirectory(CheckpointDir(root, name), options);
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::OpenDirectory(
    absl::string_view dir, const CheckpointIoOptions& options) {
  OPTSTEP_ASSIGN_OR_RETURN(Manifest manifest, ReadManifestFile(dir));
  std::unique_ptr<CheckpointReader> reader(
      new CheckpointReader(std::string(dir), std::move(manifest), options));
  OPTSTEP_RETURN_IF_ERROR(reader->OpenShards());
  return reader;
}

CheckpointReader::~CheckpointReader() {
  for (int fd : fds_) ::close(fd);
}

absl::Status CheckpointReader::OpenShards() {
  shards_.resize(manifest_.shards.size());
  for (size_t r = 0; r < manifest_.shards.size(); ++r) {
    const ManifestShard& shard = manifest_.shards[r];
    const std::string path = absl::StrCat(dir_, "/", shard.file);
    absl::StatusOr<internal::File> file = internal::OpenForRead(path);
    if (!file.ok()) {
      // Only a shard that is not there is the checkpoint's fault; another error (too many open
      // files, an I/O error, permissions) is the reader's or the disk's, and says so.
      if (file.status().code() != absl::StatusCode::kNotFound) return file.status();
      return absl::DataLossError(absl::StrCat("checkpoint '", dir_, "': shard '", shard.file,
                                              "' is missing: ", file.status().message()));
    }
    fds_.push_back(file->release());
    const int fd = fds_.back();
    // Whole shards are read front to back (Verify, ReadShard, tensors in file order): ask the
    // kernel for its larger sequential read-ahead.
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    OPTSTEP_ASSIGN_OR_RETURN(uint64_t size, internal::FileSize(path));
    if (size != shard.bytes) {
      return absl::DataLossError(
          absl::StrCat("shard '", path, "' has ", size, " bytes; the manifest says ", shard.bytes));
    }
    char prefix[8] = {};
    OPTSTEP_RETURN_IF_ERROR(internal::PreadAll(fd, prefix, std::min<uint64_t>(8, size), 0, path));
    OPTSTEP_ASSIGN_OR_RETURN(uint64_t header_bytes, ParseSafetensorsHeaderLength(
                                                        absl::string_view(prefix, 8), size, path));
    std::string json(header_bytes, '\0');
    OPTSTEP_RETURN_IF_ERROR(internal::PreadAll(fd, json.data(), header_bytes, 8, path));
    OPTSTEP_ASSIGN_OR_RETURN(SafetensorsHeader header, ParseSafetensorsHeader(json, size, path));
    for (SafetensorsEntry& entry : header.entries) {
      shards_[r].push_back({std::move(entry.key), entry.type, std::move(entry.shape),
                            static_cast<int>(r), header.data_start + entry.begin,
                            entry.end - entry.begin});
    }
  }
  // Pointers into shards_ stay valid: the vectors are complete now.
  for (const std::vector<CheckpointTensor>& shard : shards_) {
    for (const CheckpointTensor& t : shard) index_.emplace(t.key, &t);  // lowest rank wins
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::CheckCounters(int rank) const {
  const std::pair<const char*, uint64_t> counters[] = {{"step", manifest_.step},
                                                       {"skipped_steps", manifest_.skipped_steps}};
  const std::string path = absl::StrCat(dir_, "/", manifest_.shards[rank].file);
  for (const CheckpointTensor& t : shards_[rank]) {
    for (const auto& [field, expected] : counters) {
      if (t.key != absl::StrCat("meta/", field)) continue;
      if (t.type != StateTensor::Type::kI64 || !t.shape.empty()) {
        return absl::DataLossError(
            absl::StrCat("shard '", path, "': tensor '", t.key, "' is not a 0-d I64 counter"));
      }
      int64_t value = 0;
      OPTSTEP_RETURN_IF_ERROR(
          internal::PreadAll(fds_[rank], &value, sizeof(value), t.file_offset, path));
      if (value < 0 || static_cast<uint64_t>(value) != expected) {
        return absl::DataLossError(absl::StrCat(
            "manifest field '", field, "' = ", expected, " does not match tensor '", t.key,
            "' = ", value, " in shard '", path, "' (an edited or mismatched manifest)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::Verify(const CheckpointProgressCallback& progress) const {
  CheckpointProgress report;
  report.files_total = static_cast<int>(fds_.size());
  for (const ManifestShard& shard : manifest_.shards) report.bytes_total += shard.bytes;
  for (size_t r = 0; r < fds_.size(); ++r) {
    OPTSTEP_RETURN_IF_ERROR(ScanShard(static_cast<int>(r), nullptr, report, progress));
  }
  // Every byte is as written: now the manifest's counters must be the shards'.
  for (size_t r = 0; r < fds_.size(); ++r) {
    OPTSTEP_RETURN_IF_ERROR(CheckCounters(static_cast<int>(r)));
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadShard(int rank, const ShardTensorSink& sink,
                                         const CheckpointProgressCallback& progress) const {
  CheckpointProgress report;
  report.files_total = 1;
  report.bytes_total = manifest_.shards[rank].bytes;
  OPTSTEP_RETURN_IF_ERROR(ScanShard(rank, sink, report, progress));
  return CheckCounters(rank);
}

absl::Status CheckpointReader::ScanShard(int rank, const ShardTensorSink& sink,
                                         CheckpointProgress& report,
                                         const CheckpointProgressCallback& progress) const {
  const ManifestShard& shard = manifest_.shards[rank];
  const std::string path = absl::StrCat(dir_, "/", shard.file);
  const int fd = fds_[rank];
  const size_t capacity = StagingSize(options_);
  std::unique_ptr<char[]> buffers[2] = {std::make_unique<char[]>(capacity),
                                        std::make_unique<char[]>(capacity)};
  auto read_piece = [&](uint64_t offset, int b) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(capacity, shard.bytes - offset));
    char* dst = buffers[b].get();
    return std::async(std::launch::async, [fd, dst, n, offset, &path] {
      return internal::PreadAll(fd, dst, n, offset, path);
    });
  };
  const std::vector<CheckpointTensor>& tensors = shards_[rank];  // in file order
  size_t next_tensor = 0;
  uint32_t crc = 0;
  int current = 0;
  std::future<absl::Status> pending;
  if (shard.bytes > 0) pending = read_piece(0, current);
  for (uint64_t offset = 0; offset < shard.bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(capacity, shard.bytes - offset));
    OPTSTEP_RETURN_IF_ERROR(pending.get());
    if (offset + n < shard.bytes) pending = read_piece(offset + n, current ^ 1);
    const char* data = buffers[current].get();
    crc = Crc32cExtend(crc, data, n);
    // Deliver the tensors that overlap [offset, offset + n).
    while (sink && next_tensor < tensors.size()) {
      const CheckpointTensor& t = tensors[next_tensor];
      const uint64_t begin = std::max(offset, t.file_offset);
      const uint64_t end = std::min(offset + n, t.file_offset + t.bytes);
      if (t.bytes > 0 && begin >= end) break;  // starts in a later piece
      if (begin < end) {
        absl::Status status = sink(t, begin - t.file_offset, end - begin, data + (begin - offset));
        if (!status.ok()) {
          if (pending.valid()) pending.wait();  // its buffer goes away with this frame
          return status;
        }
      }
      if (t.file_offset + t.bytes > offset + n) break;  // continues in the next piece
      ++next_tensor;
    }
    offset += n;
    current ^= 1;
    report.bytes_done += n;
    if (progress) progress(report);
  }
  if (crc != shard.crc32c) {
    return absl::DataLossError(
        absl::StrFormat("shard '%s': CRC-32C mismatch: manifest says %08x, the file has %08x", path,
                        shard.crc32c, crc));
  }
  ++report.files_done;
  if (progress) progress(report);
  return absl::OkStatus();
}

const CheckpointTensor* CheckpointReader::Find(absl::string_view key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> CheckpointReader::Keys() const {
  std::vector<std::string> keys;
  keys.reserve(index_.size());
  for (const auto& [key, tensor] : index_) keys.push_back(key);
  return keys;
}

uint64_t CheckpointReader::TotalTensorBytes() const {
  uint64_t total = 0;
  for (const std::vector<CheckpointTensor>& shard : shards_) {
    for (const CheckpointTensor& t : shard) total += t.bytes;
  }
  return total;
}

absl::Status CheckpointReader::Read(const CheckpointTensor& tensor,
                                    const TensorByteWriter& sink) const {
  const size_t capacity = StagingSize(options_);
  std::unique_ptr<char[]> buffer(new char[static_cast<size_t>(
      std::min<uint64_t>(capacity, std::max<uint64_t>(tensor.bytes, 1)))]);
  const std::string path = absl::StrCat(dir_, "/", manifest_.shards[tensor.shard].file);
  for (uint64_t offset = 0; offset < tensor.bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(capacity, tensor.bytes - offset));
    OPTSTEP_RETURN_IF_ERROR(
        internal::PreadAll(fds_[tensor.shard], buffer.get(), n, tensor.file_offset + offset, path));
    OPTSTEP_RETURN_IF_ERROR(sink(offset, n, buffer.get()));
    offset += n;
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::Read(const CheckpointTensor& tensor, void* dst) const {
  // Straight into the destination: no staging needed for host memory.
  return ReadRange(tensor, 0, tensor.bytes, dst);
}

absl::Status CheckpointReader::ReadRange(const CheckpointTensor& tensor, uint64_t offset, size_t n,
                                         void* dst) const {
  if (offset > tensor.bytes || n > tensor.bytes - offset) {
    return absl::OutOfRangeError(absl::StrCat("bytes [", offset, ", ", offset + n, ") of tensor '",
                                              tensor.key, "' (", tensor.bytes, " bytes)"));
  }
  const std::string path = absl::StrCat(dir_, "/", manifest_.shards[tensor.shard].file);
  return internal::PreadAll(fds_[tensor.shard], dst, n, tensor.file_offset + offset, path);
}

absl::Status CheckpointReader::ReadKey(absl::string_view key, void* dst, size_t dst_bytes) const {
  const CheckpointTensor* tensor = Find(key);
  if (tensor == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint '", dir_, "' has no tensor '", key, "'"));
  }
  if (tensor->bytes != dst_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", key, "' (", SafetensorsDType(tensor->type), " ", ShapeString(tensor->shape),
        ") has ", tensor->bytes, " bytes; the destination holds ", dst_bytes));
  }
  return Read(*tensor, dst);
}

}  // namespace optstep
