// Writes the toy task (toy_task.h) as JSONL, {"prompt": ..., "label": ...} per line, for
// --prompt-data. configs/data/toy_task.jsonl was made with
//   bazel run //trainer/data:make_toy_task -- 512 1 $PWD/configs/data/toy_task.jsonl
// Usage: make_toy_task COUNT SEED OUTPUT
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "launch/json.h"
#include "trainer/data/toy_task.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s COUNT SEED OUTPUT.jsonl\n", argv[0]);
    return 2;
  }
  const int64_t count = std::strtoll(argv[1], nullptr, 10);
  const uint64_t seed = std::strtoull(argv[2], nullptr, 10);
  const std::string path = argv[3];
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    for (const rl::data::PromptExample& e : rl::data::MakeToyTask(count, seed)) {
      out << rl::json::Dump(rl::json::Value::MakeObject({
                 {"prompt", rl::json::Value::String(e.text)},
                 {"label", rl::json::Value::String(e.label)},
             }))
          << '\n';
    }
    if (!out.flush()) {
      std::fprintf(stderr, "%s: write failed\n", temp.c_str());
      return 1;
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    std::perror(path.c_str());
    return 1;
  }
  return 0;
}
