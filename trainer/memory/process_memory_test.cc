// The process RSS follows a CPU region: it grows when the region is touched and drops by about
// the region's size when the region is paused.
#include "trainer/memory/process_memory.h"

#include <catch2/catch.hpp>
#include <cstring>

#include "trainer/memory/region.h"

namespace rl::memory {
namespace {

TEST_CASE("the RSS drops by about a touched region's size when the region is paused") {
  constexpr int64_t kRegionBytes = 64 << 20;
  Region region(RegionTag::kGradBuffer, kRegionBytes, c10::Device(c10::kCPU), HostBackup::kNone);
  const int64_t untouched = ProcessRssBytes();
  std::memset(region.data(), 1, kRegionBytes);
  const int64_t touched = ProcessRssBytes();
  region.Pause();
  const int64_t paused = ProcessRssBytes();
  // Tolerance: 10% of the region for whatever else the process does meanwhile.
  CHECK(touched - untouched > kRegionBytes * 9 / 10);
  CHECK(touched - paused > kRegionBytes * 9 / 10);
  CHECK(paused > 0);
}

}  // namespace
}  // namespace rl::memory
