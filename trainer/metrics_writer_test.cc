#include "trainer/metrics_writer.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "launch/atomic_file.h"
#include "launch/check.h"

namespace rl {
namespace {

json::Value Line(int64_t iteration) {
  json::Value line = json::Value::MakeObject({});
  line.Set("iteration", json::Value::Int(iteration));
  line.Set("loss", json::Value::Double(0.5));
  return line;
}

TEST_CASE("metrics lines are written one object per line; a resumed run appends") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/metrics.jsonl";
  {
    MetricsWriter writer(path, MetricsFileMode::kTruncate);
    CHECK(writer.enabled());
    writer.Write(Line(1));
    CHECK(ReadWholeFile(path) == "{\"iteration\":1,\"loss\":0.5}\n");  // flushed as written
  }
  MetricsWriter(path, MetricsFileMode::kAppend).Write(Line(2));
  CHECK(ReadWholeFile(path) == "{\"iteration\":1,\"loss\":0.5}\n{\"iteration\":2,\"loss\":0.5}\n");
  MetricsWriter(path, MetricsFileMode::kTruncate).Write(Line(3));
  CHECK(ReadWholeFile(path) == "{\"iteration\":3,\"loss\":0.5}\n");
}

TEST_CASE("a disabled writer writes nothing; an unwritable path names the option") {
  MetricsWriter disabled;
  CHECK(!disabled.enabled());
  disabled.Write(Line(1));
  CHECK_THROWS_MATCHES(MetricsWriter("/nonexistent/dir/m.jsonl", MetricsFileMode::kTruncate),
                       ConfigError,
                       Catch::Message("--metrics-out /nonexistent/dir/m.jsonl: cannot open for "
                                      "writing"));
}

}  // namespace
}  // namespace rl
