#ifndef OPTSTEP_TESTS_INTEGRATION_TEST_METRICS_H_
#define OPTSTEP_TESTS_INTEGRATION_TEST_METRICS_H_

// Reads a server's Prometheus endpoint over a plain socket, as a scraper would.

#include <map>
#include <string>

#include "absl/status/status.h"

namespace optstep {
namespace testutil {

// One HTTP/1.0 GET on 127.0.0.1:port; answers the whole response ("" when unreachable).
std::string HttpGet(int port, const std::string& path);

// The "name{labels} value" lines of /metrics keyed by "name{labels}"; empty unless the answer
// is 200 OK.
std::map<std::string, double> ScrapeMetrics(int port);

// Scrapes until `key` has `value` (the server sees a stream some time after the client opened
// it); DEADLINE_EXCEEDED with the last value after 5 s.
absl::Status AwaitMetric(int port, const std::string& key, double value);

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_INTEGRATION_TEST_METRICS_H_
