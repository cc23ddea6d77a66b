// The manager owns one region per tag, forwards pause/resume, and sums the byte reports.
#include "trainer/memory/region_manager.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <string>

#include "launch/check.h"

namespace rl::memory {
namespace {

const c10::Device kCpu(c10::kCPU);
constexpr int64_t kMiB = 1 << 20;

TEST_CASE("the manager reports per-tag and total bytes through pause and resume") {
  RegionManager manager(kCpu, FreshPages::kAsMapped);
  manager.Create(RegionTag::kParamBuffer, 4 * kMiB, HostBackup::kNone);
  manager.Create(RegionTag::kOptimizer, 2 * kMiB, HostBackup::kSaveOnPause);
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
  RegionManager manager(kCpu, FreshPages::kAsMapped);
  manager.Create(RegionTag::kGradBuffer, kMiB, HostBackup::kNone);
  CHECK_THROWS_WITH(manager.Create(RegionTag::kGradBuffer, kMiB, HostBackup::kNone),
                    Catch::Contains("'grad_buffer' exists already"));
  CHECK_THROWS_WITH(manager.Pause(RegionTag::kExtras),
                    Catch::Contains("'extras' was never created"));
  manager.Pause(RegionTag::kGradBuffer);
  CHECK_THROWS_WITH(manager.Pause(RegionTag::kGradBuffer),
                    "cannot pause region 'grad_buffer': it is already paused");
}

TEST_CASE("carves follow each other at aligned offsets until the region is full") {
  RegionManager manager(kCpu, FreshPages::kPoison);
  const Region& region = manager.Create(RegionTag::kExtras, 0, HostBackup::kNone);
  CHECK(region.num_bytes() == kAllocationAlignmentBytes);  // an empty region still exists
  manager.Create(RegionTag::kKvCache, 3 * kAllocationAlignmentBytes, HostBackup::kNone);
  const at::Tensor a = manager.Carve(RegionTag::kKvCache, 3, at::kFloat);
  const at::Tensor b = manager.Carve(RegionTag::kKvCache, kAllocationAlignmentBytes, at::kByte);
  const char* base = static_cast<const char*>(manager.GetOrThrow(RegionTag::kKvCache).data());
  CHECK(a.data_ptr() == base);
  CHECK(b.data_ptr() == base + kAllocationAlignmentBytes);
  CHECK(b.numel() == kAllocationAlignmentBytes);
  CHECK(b[0].item<uint8_t>() == 0xFF);  // the region's contents: carving does not zero
  CHECK_THROWS_WITH(manager.Carve(RegionTag::kKvCache, kAllocationAlignmentBytes + 1, at::kByte),
                    "region 'kv_cache' is too small: 257 bytes asked at offset 512 of 768");
  CHECK(manager.Carve(RegionTag::kKvCache, kAllocationAlignmentBytes, at::kByte).numel() ==
        kAllocationAlignmentBytes);
}

TEST_CASE("FormatBytes picks a binary unit with two decimals") {
  CHECK(FormatBytes(0) == "0 B");
  CHECK(FormatBytes(1023) == "1023 B");
  CHECK(FormatBytes(4096) == "4.00 KiB");
  CHECK(FormatBytes(3 * (int64_t{1} << 29)) == "1.50 GiB");
}

}  // namespace
}  // namespace rl::memory
