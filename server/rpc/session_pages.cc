#include "server/rpc/session_pages.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace optstep {
namespace {

// Bytes a page may add per parameter beyond its ParameterSpec: the spec's tag and length, its
// owner (a varint) and its id in a group's param_ids (a varint).
constexpr size_t kParamEntryBytes = 2 + 5 + 5 + 5;
// Bytes of the packed fields' tags and lengths that a page adds to the fixed part, per group and
// once for the owners.
constexpr size_t kPackedHeaderBytes = 2 + 5;

void CountersToProto(const Session& session, v1::SessionInfo* info) {
  const SessionStats stats = session.stats();
  info->set_step(stats.step);
  info->set_skipped_steps(stats.skipped_steps);
  info->set_step_running(stats.step_running);
  info->set_param_bytes(stats.param_bytes);
  info->set_state_bytes(stats.state_bytes);
  info->set_num_parameters(session.config().params.size());
}

// The page without parameters: everything that is whole on every page.
void FixedPartToProto(const Session& session, const RankDirectory& ranks, v1::SessionInfo* page) {
  const SessionConfig& config = session.config();
  page->set_session_id(session.id());
  page->mutable_layout()->set_world_size(session.layout().world_size);
  page->mutable_layout()->set_returns_owned(true);
  RankDirectoryToProto(ranks, page->mutable_layout());
  for (const GroupRuntime& g : session.groups()) {
    v1::GroupInfo* group = page->add_groups();
    group->set_id(g.def.id);
    group->set_sub_optimizer(config.chain.sub_optimizers[g.def.sub_optimizer].name);
    group->set_lr(g.optimizer->default_lr());
    group->set_weight_decay(g.optimizer->default_weight_decay());
    group->set_wd_mult(g.def.wd_mult);
  }
  CountersToProto(session, page);
}

}  // namespace

void SessionSummaryToProto(const Session& session, const RankDirectory& ranks,
                           v1::SessionSummary* summary) {
  const SessionConfig& config = session.config();
  const SessionStats stats = session.stats();
  summary->set_session_id(session.id());
  summary->set_name(config.name);
  summary->set_owner(config.owner);
  summary->set_step(stats.step);
  summary->set_skipped_steps(stats.skipped_steps);
  summary->set_num_parameters(config.params.size());
  summary->set_param_bytes(stats.param_bytes);
  summary->set_state_bytes(stats.state_bytes);
  summary->set_world_size(session.layout().world_size);
  RankDirectoryToProto(ranks, summary);
  summary->set_num_trainers(config.num_trainers);
  summary->set_gradient_mode(config.mode == GradientMode::kReplicated ? v1::GRADIENT_MODE_REPLICATED
                                                                      : v1::GRADIENT_MODE_SHARDED);
}

absl::Status SessionPageToProto(const Session& session, const RankDirectory& ranks, uint64_t offset,
                                uint32_t limit, size_t max_bytes, v1::SessionInfo* page) {
  const size_t count = session.config().params.size();
  if (offset > count) {
    return absl::OutOfRangeError(absl::StrCat("session '", session.id(), "' has ", count,
                                              " parameters; layout_offset ", offset,
                                              " is past the last"));
  }
  v1::SessionSpec spec;
  if (!spec.ParseFromString(session.config().definition_key)) {
    return absl::InternalError(absl::StrCat("session '", session.id(), "': bad definition"));
  }
  FixedPartToProto(session, ranks, page);
  page->set_layout_offset(offset);
  v1::SessionSpec* page_spec = page->mutable_spec();
  page_spec->Swap(&spec);
  google::protobuf::RepeatedPtrField<v1::ParameterSpec> all;
  all.Swap(page_spec->mutable_parameters());

  if (limit == 0 || limit > kMaxLayoutPage) limit = kMaxLayoutPage;
  size_t bytes = page->ByteSizeLong() + kPackedHeaderBytes * (page->groups_size() + 1);
  uint64_t end = offset;
  while (end < count && end - offset < limit) {
    const size_t cost = all.Get(static_cast<int>(end)).ByteSizeLong() + kParamEntryBytes;
    if (end > offset && bytes + cost > max_bytes) break;
    bytes += cost;
    ++end;
  }
  for (uint64_t i = offset; i < end; ++i) {
    page_spec->add_parameters()->Swap(all.Mutable(static_cast<int>(i)));
    page->mutable_layout()->add_owner(session.layout().owner[i]);
  }
  for (size_t g = 0; g < session.groups().size(); ++g) {
    for (int id : session.groups()[g].def.param_ids) {
      if (static_cast<uint64_t>(id) >= offset && static_cast<uint64_t>(id) < end) {
        page->mutable_groups(static_cast<int>(g))->add_param_ids(id);
      }
    }
  }
  return absl::OkStatus();
}

void SessionsPageToProto(const std::vector<std::shared_ptr<Session>>& sessions,
                         const Caller& caller, const v1::ListSessionsRequest& request,
                         const RankDirectory& ranks, v1::ListSessionsResponse* page) {
  uint32_t size = request.page_size();
  if (size == 0) size = kDefaultSessionsPage;
  size = std::min(size, kMaxSessionsPage);
  std::vector<const Session*> after;
  for (const auto& session : sessions) {
    if (session->id() > request.page_token() && MaySee(caller, *session)) {
      after.push_back(session.get());
    }
  }
  std::sort(after.begin(), after.end(),
            [](const Session* a, const Session* b) { return a->id() < b->id(); });
  const size_t n = std::min<size_t>(size, after.size());
  for (size_t i = 0; i < n; ++i) {
    SessionSummaryToProto(*after[i], ranks, page->add_sessions());
  }
  if (n < after.size()) page->set_next_page_token(after[n - 1]->id());
  RankDirectoryToProto(ranks, page);
}

absl::Status CheckAnswerSize(const google::protobuf::Message& answer, size_t max_bytes,
                             absl::string_view what) {
  const size_t bytes = answer.ByteSizeLong();
  if (bytes <= max_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(what, " is ", bytes,
                                                   " bytes, over the message size of ", max_bytes,
                                                   " bytes (--max_message_bytes)"));
}

}  // namespace optstep
