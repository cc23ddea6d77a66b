#include "trainer/memory/process_memory.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "launch/check.h"

namespace rl::memory {

int64_t ProcessRssBytes() {
  std::FILE* file = std::fopen("/proc/self/statm", "r");
  RL_CHECK(file != nullptr, Error, "cannot open /proc/self/statm to read the process RSS: {}",
           std::strerror(errno));
  long long size_pages = 0;
  long long resident_pages = 0;
  const int fields = std::fscanf(file, "%lld %lld", &size_pages, &resident_pages);
  std::fclose(file);
  RL_CHECK(fields == 2, Error, "cannot parse /proc/self/statm (read {} of 2 fields)", fields);
  return static_cast<int64_t>(resident_pages) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace rl::memory
