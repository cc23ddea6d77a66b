#include "trainer/metrics_writer.h"

#include "launch/check.h"

namespace rl {

MetricsWriter::MetricsWriter(const std::string& path, MetricsFileMode mode)
    : out_(path, mode == MetricsFileMode::kAppend ? std::ios::app : std::ios::trunc) {
  RL_CHECK(out_.good(), ConfigError, "--metrics-out {}: cannot open for writing", path);
}

void MetricsWriter::Write(const json::Value& line) {
  if (!enabled()) return;
  out_ << json::Dump(line) << "\n";
  out_.flush();
}

}  // namespace rl
