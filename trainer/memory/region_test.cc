// CPU regions keep their address, really lose their contents without a backup, restore them bit
// for bit with one, enforce the pause/resume state machine and report their bytes exactly.
#include "trainer/memory/region.h"

#include <ATen/ATen.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "launch/check.h"

namespace rl::memory {
namespace {

const c10::Device kCpu(c10::kCPU);
constexpr int64_t kRegionBytes = 3 * 1000 * 1000 + 12;  // Not a page multiple on purpose.

// Distinct non-zero bytes, so that neither zero pages nor 0xFF poison can pass for them.
void FillPattern(Region& region) {
  auto* bytes = static_cast<uint8_t*>(region.data());
  for (int64_t i = 0; i < region.num_bytes(); ++i) {
    bytes[i] = static_cast<uint8_t>(1 + i % 251);
  }
}

bool HoldsPattern(const Region& region) {
  const auto* bytes = static_cast<const uint8_t*>(region.data());
  for (int64_t i = 0; i < region.num_bytes(); ++i) {
    if (bytes[i] != static_cast<uint8_t>(1 + i % 251)) return false;
  }
  return true;
}

bool AllBytesAre(const Region& region, uint8_t value) {
  const auto* bytes = static_cast<const uint8_t*>(region.data());
  for (int64_t i = 0; i < region.num_bytes(); ++i) {
    if (bytes[i] != value) return false;
  }
  return true;
}

std::string MessageOf(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no exception)";
}

TEST_CASE("a view keeps its data pointer across pause and resume") {
  Region region(RegionTag::kParamBuffer, kRegionBytes, kCpu, HostBackup::kNone);
  const at::Tensor view = region.View(at::kFloat, 64, {10, 20});
  void* const before = view.data_ptr();
  // void*, not char*: Catch2 would print a char* as a C string, reading the region.
  REQUIRE(before == static_cast<void*>(static_cast<char*>(region.data()) + 64));
  for (int cycle = 0; cycle < 3; ++cycle) {
    region.Pause();
    region.Resume();
    CHECK(view.data_ptr() == before);
    CHECK(region.data() == static_cast<void*>(static_cast<char*>(before) - 64));
  }
  view.fill_(2.5f);  // Writable again after resume.
  CHECK(view.sum().item<float>() == 2.5f * 200);
}

TEST_CASE("without a backup, pause and resume lose the contents: the pages come back as zeros") {
  Region region(RegionTag::kGradBuffer, kRegionBytes, kCpu, HostBackup::kNone);
  FillPattern(region);
  REQUIRE(HoldsPattern(region));
  region.Pause();
  region.Resume();
  CHECK(AllBytesAre(region, 0));
}

TEST_CASE("FreshPages::kPoison fills a region without backup with 0xFF (NaN) on resume") {
  Region region(RegionTag::kParamBuffer, kRegionBytes, kCpu, HostBackup::kNone,
                FreshPages::kPoison);
  CHECK(AllBytesAre(region, 0xFF));  // Poisoned at creation too.
  FillPattern(region);
  region.Pause();
  region.Resume();
  CHECK(AllBytesAre(region, 0xFF));
  const at::Tensor as_bf16 = region.AsTensor(at::kBFloat16);
  CHECK(at::isnan(as_bf16).all().item<bool>());
}

TEST_CASE("with kSaveOnPause the contents come back bit-identical, through one host buffer") {
  Region region(RegionTag::kOptimizer, kRegionBytes, kCpu, HostBackup::kSaveOnPause,
                FreshPages::kPoison);
  const void* const host_buffer = region.host_backup_data();
  REQUIRE(host_buffer != nullptr);
  FillPattern(region);
  for (int cycle = 0; cycle < 3; ++cycle) {
    region.Pause();
    CHECK(region.host_backup_data() == host_buffer);
    region.Resume();
    CHECK(region.host_backup_data() == host_buffer);
    CHECK(HoldsPattern(region));
  }
}

TEST_CASE("pausing a paused region throws naming the tag and the state") {
  Region region(RegionTag::kGradBuffer, kRegionBytes, kCpu, HostBackup::kNone);
  region.Pause();
  CHECK(MessageOf([&] { region.Pause(); }) ==
        "cannot pause region 'grad_buffer': it is already paused");
  CHECK(region.is_paused());
  region.Resume();  // The failed pause left the state machine intact.
}

TEST_CASE("resuming an active region throws naming the tag and the state") {
  Region region(RegionTag::kKvCache, kRegionBytes, kCpu, HostBackup::kSaveOnPause);
  CHECK(MessageOf([&] { region.Resume(); }) ==
        "cannot resume region 'kv_cache': it is already active");
  CHECK(region.state() == RegionState::kActive);
}

TEST_CASE("byte reports: device bytes drop to 0 while paused, host bytes are the exact size") {
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t rounded = (kRegionBytes + page - 1) / page * page;

  Region saved(RegionTag::kOptimizer, kRegionBytes, kCpu, HostBackup::kSaveOnPause);
  Region dropped(RegionTag::kGradBuffer, kRegionBytes, kCpu, HostBackup::kNone);
  CHECK(saved.num_bytes() == kRegionBytes);
  CHECK(saved.reserved_bytes() == rounded);
  CHECK(saved.device_bytes() == rounded);
  CHECK(saved.host_bytes() == kRegionBytes);
  CHECK(dropped.host_bytes() == 0);
  CHECK(dropped.host_backup_data() == nullptr);

  saved.Pause();
  dropped.Pause();
  CHECK(saved.device_bytes() == 0);
  CHECK(dropped.device_bytes() == 0);
  CHECK(saved.host_bytes() == kRegionBytes);
  CHECK(dropped.host_bytes() == 0);

  saved.Resume();
  dropped.Resume();
  CHECK(saved.device_bytes() == rounded);
  CHECK(dropped.device_bytes() == rounded);
}

TEST_CASE("a paused CPU region is inaccessible: a stray read faults") {
  Region region(RegionTag::kExtras, kRegionBytes, kCpu, HostBackup::kNone);
  region.Pause();
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::signal(SIGSEGV, SIG_DFL);  // Not Catch2's handler, which would report a failed test.
    volatile const uint8_t* bytes = static_cast<const uint8_t*>(region.data());
    const uint8_t value = bytes[100];
    _exit(value == 0 ? 0 : 1);  // Reached only if the read did not fault.
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
}

TEST_CASE("views that are misaligned or end past the region throw, naming the region") {
  Region region(RegionTag::kParamBuffer, 1024, kCpu, HostBackup::kNone);
  CHECK_NOTHROW(region.View(at::kFloat, 1020, {1}));
  CHECK(MessageOf([&] { region.View(at::kFloat, 1024, {1}); }).find("'param_buffer'") !=
        std::string::npos);
  CHECK(MessageOf([&] { region.View(at::kFloat, 2, {1}); }).find("not aligned") !=
        std::string::npos);
  CHECK(MessageOf([&] { region.View(at::kFloat, 0, {-1}); }).find("negative") != std::string::npos);
  CHECK(region.AsTensor(at::kFloat).numel() == 256);
  CHECK(region.AsTensor(at::kDouble).device() == kCpu);
}

TEST_CASE("a region rejects a non-positive size") {
  CHECK(MessageOf([] {
          Region(RegionTag::kExtras, 0, kCpu, HostBackup::kNone);
        }).find("positive size") != std::string::npos);
}

TEST_CASE("every tag has its own name") {
  std::set<std::string_view> names;
  for (RegionTag tag : kAllRegionTags) names.insert(RegionTagName(tag));
  CHECK(names.size() == kAllRegionTags.size());
  CHECK(RegionTagName(RegionTag::kRolloutWeights) == "rollout_weights");
}

}  // namespace
}  // namespace rl::memory
