// CUDA regions (virtual memory management): the address survives pause/resume, pausing really
// gives the memory back to the device, and a host backup restores the contents bit for bit into
// views made before the pause. Skips loudly on a machine without a CUDA device.
#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>

#include "launch/check.h"
#include "trainer/memory/region.h"

namespace rl::memory {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

bool HaveCudaDeviceOrWarn() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  if (!ok) {
    WARN("SKIPPED: no CUDA device on this machine; the CUDA region tests did not run");
    SUCCEED();
  }
  return ok;
}

int64_t FreeDeviceBytes() {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  RL_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(free_bytes);
}

double MillisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

const c10::Device kCuda(c10::kCUDA, 0);

TEST_CASE("a CUDA region keeps its virtual address across pause and resume", "[gpu]") {
  if (!HaveCudaDeviceOrWarn()) return;
  Region region(RegionTag::kParamBuffer, 100 * kMiB + 7, kCuda, HostBackup::kNone);
  void* const base = region.data();
  const at::Tensor view = region.View(at::kBFloat16, 1024, {4096});
  for (int cycle = 0; cycle < 3; ++cycle) {
    region.Pause();
    CHECK(region.device_bytes() == 0);
    region.Resume();
    CHECK(region.data() == base);
    // void*, not char*: Catch2 would print a char* as a C string, reading device memory.
    CHECK(view.data_ptr() == static_cast<void*>(static_cast<char*>(base) + 1024));
  }
  view.fill_(1.0);  // The remapped memory is usable through the old view.
  CHECK(view.sum().item<float>() == 4096.0f);
  fmt::print("[gpu] region {} bytes, reserved {} bytes (granularity rounding)\n",
             region.num_bytes(), region.reserved_bytes());
}

TEST_CASE("pausing a CUDA region returns its memory to the device; resuming takes it again",
          "[gpu]") {
  if (!HaveCudaDeviceOrWarn()) return;
  const int64_t region_bytes = 4 * kGiB;
  Region region(RegionTag::kKvCache, region_bytes, kCuda, HostBackup::kNone);
  region.AsTensor(at::kFloat).zero_();
  RL_CHECK_CUDA(cudaDeviceSynchronize());

  const int64_t free_active = FreeDeviceBytes();
  auto start = std::chrono::steady_clock::now();
  region.Pause();
  const double pause_ms = MillisecondsSince(start);
  const int64_t free_paused = FreeDeviceBytes();
  start = std::chrono::steady_clock::now();
  region.Resume();
  const double resume_ms = MillisecondsSince(start);
  const int64_t free_resumed = FreeDeviceBytes();

  fmt::print(
      "[gpu] region {} bytes: free {} -> {} on pause (+{} bytes), -> {} on resume (-{} bytes); "
      "pause {:.3f} ms, resume {:.3f} ms (no backup)\n",
      region.reserved_bytes(), free_active, free_paused, free_paused - free_active, free_resumed,
      free_paused - free_resumed, pause_ms, resume_ms);
  // Tolerance: 64 MiB for the driver's own bookkeeping and other allocations meanwhile.
  CHECK(std::llabs((free_paused - free_active) - region.reserved_bytes()) < 64 * kMiB);
  CHECK(std::llabs((free_paused - free_resumed) - region.reserved_bytes()) < 64 * kMiB);
}

TEST_CASE("a CUDA region with kSaveOnPause restores its contents bit-identically", "[gpu]") {
  if (!HaveCudaDeviceOrWarn()) return;
  const int64_t region_bytes = 1 * kGiB + 3;
  Region region(RegionTag::kOptimizer, region_bytes, kCuda, HostBackup::kSaveOnPause,
                FreshPages::kPoison);
  const void* const host_buffer = region.host_backup_data();
  const at::Tensor bytes = region.AsTensor(at::kByte);
  bytes.copy_(at::randint(0, 256, {region_bytes}, at::TensorOptions().dtype(at::kByte)));
  const at::Tensor expected = bytes.cpu();

  for (int cycle = 0; cycle < 2; ++cycle) {
    auto start = std::chrono::steady_clock::now();
    region.Pause();
    const double pause_ms = MillisecondsSince(start);
    start = std::chrono::steady_clock::now();
    region.Resume();
    const double resume_ms = MillisecondsSince(start);
    fmt::print(
        "[gpu] backup cycle {}: {} bytes, pause (D2H + unmap) {:.3f} ms = {:.1f} GB/s, resume "
        "(map + H2D) {:.3f} ms = {:.1f} GB/s\n",
        cycle, region_bytes, pause_ms, region_bytes / pause_ms / 1e6, resume_ms,
        region_bytes / resume_ms / 1e6);
    CHECK(region.host_backup_data() == host_buffer);
    CHECK(at::equal(bytes.cpu(), expected));
  }
}

TEST_CASE("a tensor view made before pause reads the restored data after resume", "[gpu]") {
  if (!HaveCudaDeviceOrWarn()) return;
  Region region(RegionTag::kExtras, 64 * kMiB, kCuda, HostBackup::kSaveOnPause);
  const at::Tensor view = region.View(at::kFloat, 4096, {1000, 100});  // [rows, cols]
  const at::Tensor values = at::randn({1000, 100});
  view.copy_(values);
  region.Pause();
  region.Resume();
  CHECK(at::equal(view.cpu(), values));
}

TEST_CASE("a CUDA region without backup comes back poisoned with FreshPages::kPoison", "[gpu]") {
  if (!HaveCudaDeviceOrWarn()) return;
  Region region(RegionTag::kParamBuffer, 16 * kMiB, kCuda, HostBackup::kNone, FreshPages::kPoison);
  const at::Tensor params = region.AsTensor(at::kBFloat16);
  params.fill_(1.0);
  region.Pause();
  region.Resume();
  CHECK(at::isnan(params).all().item<bool>());
}

}  // namespace
}  // namespace rl::memory
