#include "server/rpc/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <exception>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/caller_text.h"
#include "base/log_budget.h"
#include "glog/logging.h"
#include "google/protobuf/descriptor.h"
#include "optstep/v1/admin_service.pb.h"
#include "optstep/v1/checkpoint_service.pb.h"
#include "optstep/v1/internal.pb.h"
#include "optstep/v1/optimizer_service.pb.h"

namespace optstep {
namespace {

// Whether `path` ("/package.Service/Method") is a method this server serves: of optstep's
// services (their descriptors, from a message of each file), or grpc.health.v1's.
bool IsServedMethod(absl::string_view path) {
  static const absl::flat_hash_set<std::string>* const served = [] {
    auto* paths = new absl::flat_hash_set<std::string>{"/grpc.health.v1.Health/Check",
                                                       "/grpc.health.v1.Health/Watch"};
    for (const google::protobuf::FileDescriptor* file :
         {v1::StepRequest::descriptor()->file(), v1::SaveRequest::descriptor()->file(),
          v1::ShutdownRequest::descriptor()->file(),
          v1::CreateReplicaRequest::descriptor()->file()}) {
      for (int s = 0; s < file->service_count(); ++s) {
        const google::protobuf::ServiceDescriptor* service = file->service(s);
        for (int m = 0; m < service->method_count(); ++m) {
          paths->insert(absl::StrCat("/", service->full_name(), "/", service->method(m)->name()));
        }
      }
    }
    return paths;
  }();
  return served->contains(path);
}

constexpr const char* kPhaseNames[] = {"ingest", "step", "all_gather", "egress"};

// 100 µs to about 50 s, a factor of about 2.5 apart: a tiny CPU step and a
// large GPU one both land inside.
prometheus::Histogram::BucketBoundaries PhaseBuckets() {
  prometheus::Histogram::BucketBoundaries bounds;
  for (double b = 1e-4; b < 60.0; b *= 2.5) bounds.push_back(b);
  return bounds;
}

const char* StepEndName(StepObserver::StepEnd end) {
  switch (end) {
    case StepObserver::StepEnd::kApplied:
      return "applied";
    case StepObserver::StepEnd::kSkipped:
      return "skipped";
    case StepObserver::StepEnd::kAborted:
      return "aborted";
    case StepObserver::StepEnd::kFailed:
      break;
  }
  return "failed";
}

prometheus::MetricFamily GaugeFamily(const std::string& name, const std::string& help,
                                     double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = prometheus::MetricType::Gauge;
  prometheus::ClientMetric metric;
  metric.gauge.value = value;
  family.metric.push_back(metric);
  return family;
}

// Gauges read from the engine at each scrape, so they are exact without bookkeeping on every
// session change.
std::vector<prometheus::MetricFamily> EngineGauges(Engine& engine) {
  const std::vector<std::shared_ptr<Session>> sessions = engine.ListSessions();
  double bytes = 0.0;
  for (const auto& session : sessions) {
    const SessionStats stats = session->stats();
    bytes += static_cast<double>(stats.param_bytes + stats.state_bytes + stats.buffer_bytes +
                                 stats.shadow_bytes);
  }
  const Engine::DeviceActivity device = engine.device_activity();
  std::vector<prometheus::MetricFamily> families = {
      GaugeFamily("optstep_sessions", "Sessions this rank holds.",
                  static_cast<double>(sessions.size())),
      GaugeFamily("optstep_device_memory_bytes",
                  "Bytes of masters, optimizer state and gradient buffers on the device, with the "
                  "shadows of state redundancy.",
                  bytes),
      GaugeFamily("optstep_device_stalled",
                  "1 while the device task that runs has passed --device_watchdog_ms, else 0.",
                  device.stalled ? 1.0 : 0.0),
      GaugeFamily("optstep_device_task_seconds",
                  "How long the device task that runs has run; 0 when the device worker is idle.",
                  absl::ToDoubleSeconds(device.running_for)),
      GaugeFamily("optstep_memory_budget_bytes",
                  "The memory this rank admits sessions into (--memory_budget or its default).",
                  static_cast<double>(engine.memory_budget().budget())),
      GaugeFamily("optstep_memory_admitted_bytes",
                  "The footprints of the sessions this rank admitted, out of its budget (with a "
                  "stand-in's, which shares it, while one runs here).",
                  static_cast<double>(engine.memory_budget().admitted())),
      GaugeFamily("optstep_shared_memory_bytes",
                  "Bytes of the segments trainers on this host share with the rank (counted in "
                  "optstep_memory_admitted_bytes).",
                  static_cast<double>(engine.shared_segments().bytes()))};
  // Facts about the device, as a gauge of 1 labelled with the value; none where it is empty.
  const auto add_info = [&families](const char* name, const char* help, const char* label,
                                    const std::string& value) {
    if (value.empty()) return;
    families.push_back(GaugeFamily(name, help, 1.0));
    families.back().metric[0].label.push_back({label, value});
  };
  add_info("optstep_cpu_isa",
           "1, labelled with the instruction-set variant of the CPU element-wise kernels.",
           "variant", engine.device().cpu_isa());
  add_info("optstep_gemm_backend",
           "1, labelled with the library of the device's bf16-class (medium) GEMMs.", "backend",
           engine.device().gemm_backend());
  return families;
}

}  // namespace

ServerMetrics::ServerMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  phases_ = &prometheus::BuildHistogram()
                 .Name("optstep_step_phase_seconds")
                 .Help("Duration of the phases of a step.")
                 .Register(*registry_);
  for (int p = 0; p < 4; ++p) {
    phase_histograms_[p] = &phases_->Add({{"phase", kPhaseNames[p]}}, PhaseBuckets());
  }
  bytes_in_ = &prometheus::BuildCounter()
                   .Name("optstep_gradient_bytes_received_total")
                   .Help(
                       "Raw gradient bytes accepted from trainers (streamed, or read from "
                       "shared memory).")
                   .Register(*registry_)
                   .Add({});
  bytes_out_ = &prometheus::BuildCounter()
                    .Name("optstep_parameter_bytes_sent_total")
                    .Help(
                        "Raw parameter bytes streamed back to trainers (or written into "
                        "shared memory).")
                    .Register(*registry_)
                    .Add({});
  steps_ = &prometheus::BuildCounter()
                .Name("optstep_steps_total")
                .Help("Steps by how they ended: applied, skipped, aborted, failed.")
                .Register(*registry_);
  rpc_errors_ = &prometheus::BuildCounter()
                     .Name("optstep_rpc_errors_total")
                     .Help("Calls that ended with an error, by method and status code.")
                     .Register(*registry_);
  active_streams_ = &prometheus::BuildGauge()
                         .Name("optstep_active_streams")
                         .Help("Streaming calls in progress.")
                         .Register(*registry_)
                         .Add({});
  peers_lost_ = &prometheus::BuildCounter()
                     .Name("optstep_peers_lost_total")
                     .Help("Peer ranks found lost: no heartbeat answered for --peer_timeout_ms.")
                     .Register(*registry_)
                     .Add({});
  stand_ins_ = &prometheus::BuildGauge()
                    .Name("optstep_stand_ins")
                    .Help(
                        "Stand-ins this rank runs in its process for lost ranks that did not "
                        "return within --rejoin_timeout_ms.")
                    .Register(*registry_)
                    .Add({});
  sessions_restored_ =
      &prometheus::BuildCounter()
           .Name("optstep_sessions_restored_total")
           .Help("Sessions rank 0 restored from their automatic checkpoints at start.")
           .Register(*registry_)
           .Add({});
  auto_checkpoints_ = &prometheus::BuildCounter()
                           .Name("optstep_auto_checkpoints_total")
                           .Help("Automatic checkpoints rank 0 committed.")
                           .Register(*registry_)
                           .Add({});
  auto_checkpoint_failures_ =
      &prometheus::BuildCounter()
           .Name("optstep_auto_checkpoint_failures_total")
           .Help(
               "Automatic checkpoint attempts that failed (rank 0): a restart of the group "
               "falls back to the newest checkpoint committed.")
           .Register(*registry_)
           .Add({});
}

ServerMetrics::~ServerMetrics() { StopServing(); }

absl::Status ServerMetrics::Serve(const std::string& host, int port, Engine* engine) {
  std::shared_ptr<prometheus::Registry> registry = registry_;
  auto http = MetricsHttpServer::Start(host, port, [registry, engine] {
    std::vector<prometheus::MetricFamily> families = registry->Collect();
    for (prometheus::MetricFamily& family : EngineGauges(*engine)) {
      families.push_back(std::move(family));
    }
    return prometheus::TextSerializer().Serialize(families);
  });
  if (!http.ok()) return http.status();
  absl::MutexLock lock(&mu_);
  http_ = *std::move(http);
  return absl::OkStatus();
}

void ServerMetrics::StopServing() {
  absl::MutexLock lock(&mu_);
  http_.reset();  // joins the HTTP thread: no scrape reads the engine after this
}

int ServerMetrics::port() const {
  absl::MutexLock lock(&mu_);
  return http_ ? http_->port() : 0;
}

void ServerMetrics::OnPhase(Phase phase, absl::Duration duration) {
  phase_histograms_[static_cast<int>(phase)]->Observe(absl::ToDoubleSeconds(duration));
}

void ServerMetrics::OnBytesIn(int64_t bytes) { bytes_in_->Increment(static_cast<double>(bytes)); }

void ServerMetrics::OnBytesOut(int64_t bytes) { bytes_out_->Increment(static_cast<double>(bytes)); }

void ServerMetrics::OnStepEnd(const std::string& session, uint64_t step, int rank, StepEnd end,
                              absl::string_view error) {
  const char* result = StepEndName(end);
  steps_->Add({{"result", result}}).Increment();
  if (end == StepEnd::kApplied || end == StepEnd::kSkipped) {
    int64_t dropped = 0;
    LOG_IF(INFO, step_lines_.Take(&dropped))
        << "event=step_" << result << " session=" << session << " step=" << step << " rank=" << rank
        << DroppedBefore(dropped);
  } else {
    int64_t dropped = 0;  // a tenant's trainers may fail step after step
    LOG_IF(WARNING, CallerLogBudget().Take(&dropped))
        << "event=step_" << result << " session=" << session << " step=" << step << " rank=" << rank
        << " error=\"" << LogValue(error) << "\"" << DroppedBefore(dropped);
  }
}

void ServerMetrics::OnSessionCreated(const std::string& session, int rank, int64_t params) {
  LOG(INFO) << "event=session_created session=" << session << " rank=" << rank
            << " params=" << params;
}

void ServerMetrics::OnSessionClosed(const std::string& session, int rank) {
  LOG(INFO) << "event=session_closed session=" << session << " rank=" << rank;
}

void ServerMetrics::StreamStarted() { active_streams_->Increment(); }

void ServerMetrics::StreamEnded() { active_streams_->Decrement(); }

void ServerMetrics::CountPeerLost() { peers_lost_->Increment(); }

void ServerMetrics::StandInsChanged(int delta) { stand_ins_->Increment(delta); }

void ServerMetrics::CountSessionRestored() { sessions_restored_->Increment(); }

void ServerMetrics::CountAutoCheckpoint() { auto_checkpoints_->Increment(); }

void ServerMetrics::CountAutoCheckpointFailure() { auto_checkpoint_failures_->Increment(); }

void ServerMetrics::CountRpcError(absl::string_view method, absl::string_view code_name) {
  // The method is the caller's :path when its call was refused before any handler: a method the
  // server does not serve is "other", so that a caller cannot add series without end.
  rpc_errors_
      ->Add({{"method", IsServedMethod(method) ? std::string(method) : std::string("other")},
             {"code", std::string(code_name)}})
      .Increment();
}

}  // namespace optstep
