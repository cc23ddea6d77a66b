// Pausable memory regions: one large allocation per tag whose physical memory can be given back
// and taken again while its virtual address stays put.
//
// They reproduce the semantics of torch_memory_saver, which the reference system pauses its
// memory with; docs/colocated-cycle.md ("Memory regions") says where the cycle uses them.
//
// Note [Pausable region contract]
// A Region is created once, with a fixed byte size, on one device. Callers carve at::Tensor
// views out of it (View, AsTensor); the region owns the memory, the views only borrow it, so no
// view may outlive its region. Pause() releases the physical memory and keeps the address range
// reserved; Resume() maps fresh memory at the same address, so every view, raw pointer and
// captured CUDA graph taken while the region was active is valid again after Resume(). Contents
// after Resume() are undefined unless the region was created with HostBackup::kSaveOnPause:
// then Pause() first copies the region to a host buffer and Resume() copies it back, bit for bit.
// The host buffer is allocated once, at creation, at exactly num_bytes() (pinned with
// cudaHostAlloc for a CUDA region, plain memory for a CPU region), and reused every cycle, so the
// host bytes a region reports are exact and constant.
// The state machine is strict, as in torch_memory_saver: pausing a paused region or resuming an
// active one throws rl::Error naming the tag and the state.
//
// Backends:
//  - CPU: an anonymous private mmap of num_bytes() rounded up to the page size. Pause() drops
//    the pages (madvise(MADV_DONTNEED)) and then mprotect(PROT_NONE)s the range, so a stray read
//    or write of a paused region faults (SIGSEGV) instead of silently reading zeros. Resume()
//    restores PROT_READ|PROT_WRITE; the pages come back zero-filled (the kernel's guarantee),
//    so CPU tests really lose the contents.
//  - CUDA: virtual memory management through the driver (see cuda_driver.h): the range is
//    reserved once with cuMemAddressReserve, num_bytes() rounded up to the allocation granularity
//    (2 MiB on current GPUs). Pause() = cuMemUnmap + cuMemRelease; Resume() = cuMemCreate +
//    cuMemMap + cuMemSetAccess at the same address. Pause() first waits for all work on the
//    region's device (cudaDeviceSynchronize), because queued kernels may still touch the memory.
//    Reading a paused CUDA region is an illegal address fault on the device.
//
// Note [Poisoned fresh pages]
// FreshPages::kPoison makes Resume() of a region without backup fill it with 0xFF bytes: NaN in
// every floating dtype (fp32, bf16, fp16), -1 in signed integers. Code that forgets to rebuild
// a region after Resume() then reads NaNs instead of plausible zeros or stale data. Tests and CI
// runs turn it on; production runs leave it off (it costs one memset of the region per resume).
//
// Thread safety: none. A Region (and RegionManager) is used by the trainer's main thread only;
// calls from several threads must be serialised by the caller. The device work a region issues
// uses the legacy default stream and is finished when Pause()/Resume() return.
// Failures: invalid arguments and state-machine violations throw rl::Error; CUDA runtime and
// driver failures throw rl::CudaError naming the call; mmap/madvise/mprotect failures throw
// rl::Error with errno's text. A Pause() or Resume() that throws leaves the region in its old
// state when the failure came before any memory was released or mapped (for example an
// out-of-memory cuMemCreate on Resume() leaves it paused, and it may be resumed again later).
// Destructors never throw.
#ifndef RL_TRAINER_MEMORY_REGION_H_
#define RL_TRAINER_MEMORY_REGION_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "launch/region_tag.h"

namespace rl::memory {

using rl::kAllRegionTags;
using rl::RegionTag;
using rl::RegionTagName;

enum class HostBackup {
  kNone,         // contents are undefined after Resume()
  kSaveOnPause,  // Pause() copies to a host buffer, Resume() copies back (bit-identical)
};

// What a region without backup holds right after Resume(). See Note [Poisoned fresh pages].
enum class FreshPages {
  kAsMapped,  // whatever the fresh memory holds (zeros on CPU)
  kPoison,    // 0xFF bytes
};

enum class RegionState { kActive, kPaused };

// "active", "paused".
std::string_view RegionStateName(RegionState state);

class Region {
 public:
  // Reserves and maps `num_bytes` (> 0) on `device` (kCPU or kCUDA with an index; a CUDA device
  // without an index means the current device). The region starts active; its initial contents
  // are as after Resume(). Throws as described above.
  Region(RegionTag tag, int64_t num_bytes, c10::Device device, HostBackup backup,
         FreshPages fresh_pages = FreshPages::kAsMapped);
  ~Region();

  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  Region(Region&&) = delete;
  Region& operator=(Region&&) = delete;

  // Saves to the host (kSaveOnPause), then releases the physical memory; the address is kept.
  // Throws rl::Error when already paused.
  void Pause();
  // Maps fresh physical memory at the same address, then restores from the host (kSaveOnPause)
  // or poisons (FreshPages::kPoison). Throws rl::Error when already active.
  void Resume();

  // A view of `shape` elements of `dtype` starting `offset_bytes` into the region. The offset
  // must be a multiple of the element size and the view must end within num_bytes(); throws
  // rl::Error otherwise. The view may be created while paused; it must only be read or written
  // while active, and it must not outlive the region.
  at::Tensor View(at::ScalarType dtype, int64_t offset_bytes, std::vector<int64_t> shape) const;
  // The whole region as a 1-D tensor of num_bytes() / element size elements.
  at::Tensor AsTensor(at::ScalarType dtype) const;

  RegionTag tag() const { return tag_; }
  std::string_view name() const { return RegionTagName(tag_); }
  c10::Device device() const { return device_; }
  HostBackup backup() const { return backup_; }
  RegionState state() const { return state_; }
  bool is_paused() const { return state_ == RegionState::kPaused; }

  // The base address; the same for the region's whole life.
  void* data() const { return base_; }
  // The size asked for at creation; views and the host backup cover exactly these bytes.
  int64_t num_bytes() const { return num_bytes_; }
  // num_bytes() rounded up to the page size (CPU) or the allocation granularity (CUDA): the
  // address range reserved, and the physical bytes mapped while active.
  int64_t reserved_bytes() const { return reserved_bytes_; }
  // Physical bytes mapped now: reserved_bytes() while active, 0 while paused. (On CPU, pages of
  // an active region are committed by the kernel on first touch; this counts them all.)
  int64_t device_bytes() const { return is_paused() ? 0 : reserved_bytes_; }
  // Host backup bytes allocated: num_bytes() with kSaveOnPause, 0 without.
  int64_t host_bytes() const { return host_backup_ != nullptr ? num_bytes_ : 0; }
  // The host backup buffer (nullptr without backup); the same pointer for the region's life.
  const void* host_backup_data() const { return host_backup_; }

 private:
  void MapPhysical();    // CUDA: create + map + set access. CPU: mprotect read/write.
  void UnmapPhysical();  // CUDA: unmap + release. CPU: madvise DONTNEED + mprotect none.
  void CopyToHost();
  void CopyFromHost();
  void Poison();
  void ReleaseAll() noexcept;  // Everything the region holds; safe on a partly built region.
  std::string StateError(std::string_view action) const;

  RegionTag tag_;
  c10::Device device_;
  HostBackup backup_;
  FreshPages fresh_pages_;
  int64_t num_bytes_ = 0;
  int64_t reserved_bytes_ = 0;
  RegionState state_ = RegionState::kPaused;
  void* base_ = nullptr;
  void* host_backup_ = nullptr;
  // CUDA only: the physical allocation while active (a CUmemGenericAllocationHandle), 0 while
  // paused.
  unsigned long long cuda_handle_ = 0;
};

}  // namespace rl::memory

#endif  // RL_TRAINER_MEMORY_REGION_H_
