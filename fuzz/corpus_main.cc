// Replays fuzz corpora as a regression test (see fuzz_target.h): runs LLVMFuzzerTestOneInput once
// on every file named on the command line and every file under a directory named there
// (recursively, in name order). Prints each input that let something escape the target, with
// the exception's message, then how many inputs ran. Exits 1 when an input failed or when no
// input was found (a corpus that went missing must not pass as an empty one).
//
// Paths are handled with POSIX calls, not std::filesystem: libtorch.so, which the safetensors
// target links, exports its own copies of the std::filesystem functions (see launch/atomic_file.h).
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/fuzz_target.h"

namespace {

// Appends `path` if it is a file, or every file below it if it is a directory. False when `path`
// cannot be read.
bool CollectInputs(const std::string& path, std::vector<std::string>* inputs) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) return false;
  if (!S_ISDIR(status.st_mode)) {
    inputs->push_back(path);
    return true;
  }
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return false;
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  bool ok = true;
  for (const std::string& name : names) ok = CollectInputs(path + "/" + name, inputs) && ok;
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    if (!CollectInputs(argv[i], &inputs)) {
      std::fprintf(stderr, "cannot read corpus path %s\n", argv[i]);
      return 1;
    }
  }
  int num_failed = 0;
  for (const std::string& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "FAIL %s: cannot open the file\n", path.c_str());
      ++num_failed;
      continue;
    }
    const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    try {
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "FAIL %s: escaped the target: %s\n", path.c_str(), e.what());
      ++num_failed;
    } catch (...) {
      std::fprintf(stderr, "FAIL %s: escaped the target: an exception of unknown type\n",
                   path.c_str());
      ++num_failed;
    }
  }
  std::printf("%zu inputs ran, %d failed\n", inputs.size(), num_failed);
  if (inputs.empty()) {
    std::fprintf(stderr, "no inputs found: the corpus is missing\n");
    return 1;
  }
  return num_failed == 0 ? 0 : 1;
}
