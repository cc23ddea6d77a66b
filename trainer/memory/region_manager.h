// The process's pausable memory regions, by tag: the one place that creates, pauses and resumes
// them, carves tensors out of them, and reports their bytes for the per-phase memory logs and the
// memory plan's checks. One manager serves the whole process (actor and rollout engine), so the
// device and the fresh-page policy are chosen once.
//
// See Note [Pausable region contract] in region.h for what a region is and promises.
//
// Ownership: the manager owns its regions; Region& references and tensor views it hands out are
// valid until the manager is destroyed. Regions are created once and never removed.
// Carve hands out a region's bytes in order; nothing is ever given back.
// Thread safety: none; the trainer's main thread is its only user.
// Failures: an unknown tag, a tag created twice, and the state-machine errors of Region throw
// rl::Error naming the tag, as does a Carve past a region's end; allocation failures throw as
// Region's constructor does.
#ifndef RL_TRAINER_MEMORY_REGION_MANAGER_H_
#define RL_TRAINER_MEMORY_REGION_MANAGER_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "trainer/memory/region.h"

namespace rl::memory {

class RegionManager {
 public:
  // Every region lives on `device`; `fresh_pages` is what a region without backup holds after
  // Resume() (Note [Poisoned fresh pages] in region.h).
  RegionManager(c10::Device device, FreshPages fresh_pages);
  ~RegionManager();
  RegionManager(const RegionManager&) = delete;
  RegionManager& operator=(const RegionManager&) = delete;

  // Creates the region for `tag` (active) of max(num_bytes, kAllocationAlignmentBytes) bytes, so that
  // a region with nothing to hold still exists and pauses like the others; throws rl::Error when
  // it exists already.
  Region& Create(RegionTag tag, int64_t num_bytes, HostBackup backup);

  // The next `numel` elements of `dtype` of region `tag`, at the first kAllocationAlignmentBytes
  // boundary after the previous carve (offset 0 for the first). Holds what the region holds
  // (zero it when zeros are needed). Throws rl::Error naming the tag when the region is too small.
  at::Tensor Carve(RegionTag tag, int64_t numel, at::ScalarType dtype);

  // Throws rl::Error naming the tag when it was never created.
  Region& GetOrThrow(RegionTag tag);
  const Region& GetOrThrow(RegionTag tag) const;

  void Pause(RegionTag tag);
  void Resume(RegionTag tag);

  // Physical device bytes mapped now (0 while paused, or for a tag never created).
  int64_t device_bytes(RegionTag tag) const;
  // Host backup bytes allocated (exactly the region's size with kSaveOnPause, else 0).
  int64_t host_bytes(RegionTag tag) const;
  int64_t total_device_bytes() const;
  int64_t total_host_bytes() const;

  // One line for the per-phase logs, regions in tag order, e.g.
  // "param_buffer active 1.00 GiB dev; optimizer paused 0 B dev 3.00 GiB host; total 1.00 GiB
  // dev 3.00 GiB host".
  std::string Summary() const;

 private:
  const Region* Find(RegionTag tag) const;

  c10::Device device_;
  FreshPages fresh_pages_;
  std::array<std::unique_ptr<Region>, kAllRegionTags.size()> regions_;
  std::array<int64_t, kAllRegionTags.size()> carved_bytes_ = {};
};

// "0 B", "512 B", "4.00 KiB", "1.50 GiB".
std::string FormatBytes(int64_t num_bytes);

}  // namespace rl::memory

#endif  // RL_TRAINER_MEMORY_REGION_MANAGER_H_
