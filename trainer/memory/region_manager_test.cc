// The manager owns one region per tag, forwards pause/resume, and sums the byte reports.
#include "trainer/memory/region_manager.h"

#include <catch2/catch.hpp>
#include <string>

#include "launch/check.h"

namespace rl::memory {
namespace {

const c10::Device kCpu(c10::kCPU);
constexpr int64_t kMiB = 1 << 20;

TEST_CASE("the manager reports per-tag and total bytes through pause and resume") {
  RegionManager manager;
  manager.Create(RegionTag::kParamBuffer, 4 * kMiB, kCpu, HostBackup::kNone);
  manager.Create(RegionTag::kOptimizer, 2 * kMiB, kCpu, HostBackup::kSaveOnPause);
  CHECK(manager.device_bytes(RegionTag::kParamBuffer) == 4 * kMiB);
  CHECK(manager.host_bytes(RegionTag::kParamBuffer) == 0);
  CHECK(manager.host_bytes(RegionTag::kOptimizer) == 2 * kMiB);
  CHECK(manager.device_bytes(RegionTag::kKvCache) == 0);  // Never created.
  CHECK(manager.total_device_bytes() == 6 * kMiB);
  CHECK(manager.total_host_bytes() == 2 * kMiB);

  manager.Pause(RegionTag::kOptimizer);
  CHECK(manager.GetOrThrow(RegionTag::kOptimizer).is_paused());
  CHECK(manager.total_device_bytes() == 4 * kMiB);
  CHECK(manager.total_host_bytes() == 2 * kMiB);
  CHECK(manager.Summary() ==
        "param_buffer active 4.00 MiB dev; optimizer paused 0 B dev 2.00 MiB host; "
        "total 4.00 MiB dev 2.00 MiB host");

  manager.Resume(RegionTag::kOptimizer);
  CHECK(manager.total_device_bytes() == 6 * kMiB);
}

TEST_CASE("a tag is created once and must exist to be used") {
  RegionManager manager;
  manager.Create(RegionTag::kGradBuffer, kMiB, kCpu, HostBackup::kNone);
  CHECK(manager.Contains(RegionTag::kGradBuffer));
  CHECK(!manager.Contains(RegionTag::kExtras));
  CHECK_THROWS_WITH(manager.Create(RegionTag::kGradBuffer, kMiB, kCpu, HostBackup::kNone),
                    Catch::Contains("'grad_buffer' exists already"));
  CHECK_THROWS_WITH(manager.Pause(RegionTag::kExtras),
                    Catch::Contains("'extras' was never created"));
  manager.Pause(RegionTag::kGradBuffer);
  CHECK_THROWS_WITH(manager.Pause(RegionTag::kGradBuffer),
                    "cannot pause region 'grad_buffer': it is already paused");
}

TEST_CASE("FormatBytes picks a binary unit with two decimals") {
  CHECK(FormatBytes(0) == "0 B");
  CHECK(FormatBytes(1023) == "1023 B");
  CHECK(FormatBytes(4096) == "4.00 KiB");
  CHECK(FormatBytes(3 * (int64_t{1} << 29)) == "1.50 GiB");
}

}  // namespace
}  // namespace rl::memory
