#include "client/cli/offline_checkpoint_commands.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/reshard.h"
#include "client/cli/commands.h"
#include "client/cli/format.h"
#include "client/cli/table.h"

namespace optstep {
namespace cli {

namespace {

int Usage(std::ostream& err, const std::string& problem) {
  err << "optstep: " << problem << "\n\n" << kCommandUsage;
  return kExitUsage;
}

int Failed(std::ostream& err, const std::string& command, const std::string& dir,
           const absl::Status& status) {
  err << FormatError("ckpt " + command, dir, status);
  return kExitCallFailed;
}

// "<root>/<name>" -> {root, name}; a bare name lies in ".".
std::pair<std::string, std::string> SplitDestination(std::string dst) {
  while (dst.size() > 1 && dst.back() == '/') dst.pop_back();
  const size_t slash = dst.rfind('/');
  if (slash == std::string::npos) return {".", dst};
  return {slash == 0 ? "/" : dst.substr(0, slash), dst.substr(slash + 1)};
}

// Parameters per rank.
std::vector<int> ParamsPerShard(const Manifest& m) {
  std::vector<int> count(m.world_size, 0);
  for (const ManifestParam& p : m.params) ++count[p.owner];
  return count;
}

}  // namespace

std::string FormatCheckpointSummary(const CheckpointReader& reader) {
  const Manifest& m = reader.manifest();
  uint64_t file_bytes = 0;
  for (const ManifestShard& s : m.shards) file_bytes += s.bytes;
  std::string out;
  absl::StrAppend(&out, "checkpoint:  ", reader.dir(), "\n");
  absl::StrAppend(&out, "format:      ", m.format_version, "\n");
  absl::StrAppend(&out, "definition:  ", m.definition_digest, "\n");
  absl::StrAppend(&out, "world size:  ", m.world_size, "\n");
  absl::StrAppend(&out, "step:        ", m.step, " (", m.skipped_steps, " skipped)\n");
  absl::StrAppend(&out, "parameters:  ", m.params.size(), "\n");
  absl::StrAppend(&out, "tensors:     ", reader.Keys().size(), " keys, ",
                  FormatBytes(reader.TotalTensorBytes()), " of tensor data\n");
  absl::StrAppend(&out, "files:       ", m.shards.size(), " shards, ", FormatBytes(file_bytes),
                  " (", file_bytes, " bytes)\n\n");
  TextTable table(
      {{"RANK", true}, {"FILE"}, {"PARAMS", true}, {"TENSORS", true}, {"BYTES", true}, {"CRC32C"}});
  const std::vector<int> params = ParamsPerShard(m);
  for (int r = 0; r < m.world_size; ++r) {
    table.AddRow({absl::StrCat(r), m.shards[r].file, absl::StrCat(params[r]),
                  absl::StrCat(reader.ShardTensors(r).size()), absl::StrCat(m.shards[r].bytes),
                  absl::StrFormat("%08x", m.shards[r].crc32c)});
  }
  out += table.Render();
  return out;
}

int RunOfflineCheckpointCommand(absl::Span<const std::string> args,
                                const OfflineCheckpointOptions& options, std::ostream& out,
                                std::ostream& err) {
  if (args.size() < 2)
    return Usage(err, "ckpt needs a subcommand: inspect, verify, merge or split");
  const std::string& sub = args[1];
  const size_t want = (sub == "inspect" || sub == "verify") ? 3 : 4;
  if (sub != "inspect" && sub != "verify" && sub != "merge" && sub != "split") {
    return Usage(err, "unknown ckpt subcommand '" + sub + "'");
  }
  if (args.size() != want) {
    return Usage(
        err, absl::StrCat("ckpt ", sub, " takes ", want - 2, " director", want == 3 ? "y" : "ies"));
  }
  if (sub == "split" && options.ranks < 1) {
    return Usage(err, absl::StrCat("ckpt split needs --ranks=N with N >= 1, not ", options.ranks));
  }
  const std::string& src_dir = args[2];
  absl::StatusOr<std::unique_ptr<CheckpointReader>> src = CheckpointReader::OpenDirectory(src_dir);
  if (!src.ok()) return Failed(err, sub, src_dir, src.status());
  if (sub == "inspect") {
    out << FormatCheckpointSummary(**src);
    return kExitOk;
  }
  // merge and split copy bytes: check them first, so that corruption is never carried over.
  absl::Status verified = (*src)->Verify();
  if (!verified.ok()) return Failed(err, sub, src_dir, verified);
  if (sub == "verify") {
    uint64_t bytes = 0;
    for (const ManifestShard& s : (*src)->manifest().shards) bytes += s.bytes;
    out << "ok: " << src_dir << ": " << (*src)->manifest().shards.size() << " shards, "
        << FormatBytes(bytes) << " verified\n";
    return kExitOk;
  }
  const auto [root, name] = SplitDestination(args[3]);
  const absl::Status written = sub == "merge" ? MergeCheckpoint(**src, root, name)
                                              : SplitCheckpoint(**src, root, name, options.ranks);
  if (!written.ok()) return Failed(err, sub, args[3], written);
  out << "wrote " << args[3] << ": " << (sub == "merge" ? 1 : options.ranks) << " shard"
      << ((sub == "merge" || options.ranks == 1) ? "" : "s") << " from " << src_dir << " ("
      << (*src)->manifest().world_size << ")\n";
  return kExitOk;
}

}  // namespace cli
}  // namespace optstep
