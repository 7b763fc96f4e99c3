#ifndef OPTSTEP_SERVER_RPC_METRICS_H_
#define OPTSTEP_SERVER_RPC_METRICS_H_

// Prometheus metrics of one rank and the structured event log lines that go
// with them.
//
//   optstep_step_phase_seconds{phase}        histogram: ingest, step, all_gather, egress
//   optstep_gradient_bytes_received_total    counter: raw gradient bytes accepted
//   optstep_parameter_bytes_sent_total       counter: raw parameter bytes streamed back
//   optstep_steps_total{result}              counter: applied, skipped, aborted, failed
//   optstep_rpc_errors_total{method,code}    counter: calls that ended with an error
//   optstep_peers_lost_total                 counter: peer ranks found lost (no heartbeat)
//   optstep_sessions_restored_total          counter: sessions restored from automatic
//                                            checkpoints at start (rank 0)
//   optstep_auto_checkpoints_total           counter: automatic checkpoints committed (rank 0)
//   optstep_auto_checkpoint_failures_total   counter: automatic checkpoint attempts that failed
//                                            (rank 0; a restart falls back further)
//   optstep_active_streams                   gauge: streaming calls in progress
//   optstep_stand_ins                        gauge: stand-ins this rank runs for lost ranks
//   optstep_sessions                         gauge: sessions this rank holds
//   optstep_device_memory_bytes              gauge: masters, optimizer state and gradient
//                                            buffers of every session
//   optstep_gemm_backend{backend}            gauge: 1, labelled with the library of the CPU
//                                            device's medium GEMMs (openblas, onednn)
//
// The engine reports through the StepObserver interface; the gRPC layer through
// CallTracker (server/rpc/call_tracker.h). Events are logged as one line of
// key=value fields each.

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "base/log_budget.h"
#include "server/engine/engine.h"
#include "server/engine/step_observer.h"
#include "server/rpc/metrics_http.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace optstep {

// Thread-safe.
class ServerMetrics final : public StepObserver {
 public:
  ServerMetrics();
  ~ServerMetrics() override;

  // Serves GET /metrics over HTTP on host:port (port 0: any free port; see
  // port()), with the gauges that `engine` answers at each scrape. UNAVAILABLE
  // when the port cannot be bound. Call StopServing before `engine` is
  // destroyed.
  absl::Status Serve(const std::string& host, int port, Engine* engine);
  void StopServing();
  // The bound port while serving, else 0.
  int port() const;

  // StepObserver.
  void OnPhase(Phase phase, absl::Duration duration) override;
  void OnBytesIn(int64_t bytes) override;
  void OnBytesOut(int64_t bytes) override;
  void OnStepEnd(const std::string& session, uint64_t step, int rank, StepEnd end,
                 absl::string_view error) override;
  void OnSessionCreated(const std::string& session, int rank, int64_t params) override;
  void OnSessionClosed(const std::string& session, int rank) override;

  // From the gRPC layer.
  void StreamStarted();
  void StreamEnded();
  // `code_name` as absl spells it, e.g. "UNAUTHENTICATED".
  void CountRpcError(absl::string_view method, absl::string_view code_name);
  // From the rank group: a peer rank was found lost (RankGroupOptions::on_peer_lost).
  void CountPeerLost();
  // From the rank process: it started (+1) or stopped (-1) a stand-in for a lost rank.
  void StandInsChanged(int delta);
  // From rank 0's automatic checkpoints: a session restored at start, a checkpoint committed, a
  // save that failed.
  void CountSessionRestored();
  void CountAutoCheckpoint();
  void CountAutoCheckpointFailure();

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>* phases_;
  prometheus::Histogram* phase_histograms_[4];
  prometheus::Counter* bytes_in_;
  prometheus::Counter* bytes_out_;
  prometheus::Family<prometheus::Counter>* steps_;
  prometheus::Family<prometheus::Counter>* rpc_errors_;
  prometheus::Gauge* active_streams_;
  prometheus::Counter* peers_lost_;
  prometheus::Gauge* stand_ins_;
  prometheus::Counter* sessions_restored_;
  prometheus::Counter* auto_checkpoints_;
  prometheus::Counter* auto_checkpoint_failures_;
  // The lines of steps applied or skipped: their own budget, of the size of the callers' (a
  // tenant stepping a tiny session as fast as it can must not fill the disk with them, nor take
  // the budget of the failures' lines).
  LogBudget step_lines_{/*per_second=*/20, /*burst=*/200};

  mutable absl::Mutex mu_;
  std::unique_ptr<MetricsHttpServer> http_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_METRICS_H_
