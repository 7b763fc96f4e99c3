#include "tests/integration/test_metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace optstep {
namespace testutil {

std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return "";
  }
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: localhost\r\n\r\n");
  (void)!send(fd, request.data(), request.size(), 0);
  std::string response;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) response.append(buffer, n);
  close(fd);
  return response;
}

std::map<std::string, double> ScrapeMetrics(int port) {
  const std::string response = HttpGet(port, "/metrics");
  std::map<std::string, double> values;
  if (response.rfind("HTTP/1.0 200 OK", 0) != 0) return values;
  std::istringstream lines(response.substr(response.find("\r\n\r\n") + 4));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double value = 0;
    if (space != std::string::npos && absl::SimpleAtod(line.substr(space + 1), &value)) {
      values[line.substr(0, space)] = value;
    }
  }
  return values;
}

absl::Status AwaitMetric(int port, const std::string& key, double value) {
  double last = 0;
  for (int i = 0; i < 250; ++i) {
    last = ScrapeMetrics(port)[key];
    if (last == value) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(key, " stayed at ", last, " instead of ", value));
}

}  // namespace testutil
}  // namespace optstep
