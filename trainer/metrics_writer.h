// The metrics file (--metrics-out): one JSON object per line, one line per iteration, flushed
// when written, so that the lines of every finished iteration survive a run that dies. A resumed
// run appends to the file of the run it resumes; a fresh run truncates it.
//
// Ownership: owns the open file. Thread safety: none (the trainer's main thread, rank 0).
// Failures: opening throws ConfigError naming --metrics-out and the path.
#ifndef RL_TRAINER_METRICS_WRITER_H_
#define RL_TRAINER_METRICS_WRITER_H_

#include <fstream>
#include <string>

#include "launch/json.h"

namespace rl {

enum class MetricsFileMode { kTruncate, kAppend };

class MetricsWriter {
 public:
  MetricsWriter() = default;  // writes nothing: no --metrics-out, or not rank 0
  MetricsWriter(const std::string& path, MetricsFileMode mode);

  bool enabled() const { return out_.is_open(); }
  // Appends `line` (an object) and a newline; nothing when disabled.
  void Write(const json::Value& line);

 private:
  std::ofstream out_;
};

}  // namespace rl

#endif  // RL_TRAINER_METRICS_WRITER_H_
