#include "trainer/memory/region_manager.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "launch/check.h"

namespace rl::memory {

RegionManager::RegionManager(c10::Device device, FreshPages fresh_pages)
    : device_(device), fresh_pages_(fresh_pages) {}
RegionManager::~RegionManager() = default;

Region& RegionManager::Create(RegionTag tag, int64_t num_bytes, HostBackup backup) {
  std::unique_ptr<Region>& slot = regions_.at(static_cast<size_t>(tag));
  RL_CHECK(slot == nullptr, Error,
           "memory region '{}' exists already ({} bytes on {}); each region is created once",
           RegionTagName(tag), slot->num_bytes(), slot->device().str());
  slot = std::make_unique<Region>(tag, std::max(num_bytes, kAllocationAlignmentBytes), device_, backup,
                                  fresh_pages_);
  return *slot;
}

at::Tensor RegionManager::Carve(RegionTag tag, int64_t numel, at::ScalarType dtype) {
  const Region& region = GetOrThrow(tag);
  int64_t& cursor = carved_bytes_.at(static_cast<size_t>(tag));
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
  RL_CHECK(cursor + bytes <= region.num_bytes(), Error,
           "region '{}' is too small: {} bytes asked at offset {} of {}", region.name(), bytes,
           cursor, region.num_bytes());
  at::Tensor view = region.View(dtype, cursor, {numel});
  cursor += AlignedAllocationBytes(bytes);
  return view;
}

const Region* RegionManager::Find(RegionTag tag) const {
  return regions_.at(static_cast<size_t>(tag)).get();
}

const Region& RegionManager::GetOrThrow(RegionTag tag) const {
  const Region* region = Find(tag);
  RL_CHECK(region != nullptr, Error, "memory region '{}' was never created", RegionTagName(tag));
  return *region;
}

Region& RegionManager::GetOrThrow(RegionTag tag) {
  return const_cast<Region&>(std::as_const(*this).GetOrThrow(tag));
}

void RegionManager::Pause(RegionTag tag) { GetOrThrow(tag).Pause(); }

void RegionManager::Resume(RegionTag tag) { GetOrThrow(tag).Resume(); }

int64_t RegionManager::device_bytes(RegionTag tag) const {
  const Region* region = Find(tag);
  return region != nullptr ? region->device_bytes() : 0;
}

int64_t RegionManager::host_bytes(RegionTag tag) const {
  const Region* region = Find(tag);
  return region != nullptr ? region->host_bytes() : 0;
}

int64_t RegionManager::total_device_bytes() const {
  int64_t total = 0;
  for (RegionTag tag : kAllRegionTags) total += device_bytes(tag);
  return total;
}

int64_t RegionManager::total_host_bytes() const {
  int64_t total = 0;
  for (RegionTag tag : kAllRegionTags) total += host_bytes(tag);
  return total;
}

std::string RegionManager::Summary() const {
  std::string text;
  for (RegionTag tag : kAllRegionTags) {
    const Region* region = Find(tag);
    if (region == nullptr) continue;
    text += fmt::format("{} {} {} dev", region->name(), RegionStateName(region->state()),
                        FormatBytes(region->device_bytes()));
    if (region->host_bytes() > 0) {
      text += fmt::format(" {} host", FormatBytes(region->host_bytes()));
    }
    text += "; ";
  }
  text += fmt::format("total {} dev {} host", FormatBytes(total_device_bytes()),
                      FormatBytes(total_host_bytes()));
  return text;
}

std::string FormatBytes(int64_t num_bytes) {
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (num_bytes < 1024 && num_bytes > -1024) {
    return fmt::format("{} B", num_bytes);
  }
  double value = static_cast<double>(num_bytes);
  int unit = -1;
  while ((value >= 1024.0 || value <= -1024.0) && unit < 3) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.2f} {}", value, kUnits[unit]);
}

}  // namespace rl::memory
