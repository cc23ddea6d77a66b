#include "backup/tensor_backuper.h"

#include <ATen/Context.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDAFunctions.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "launch/check.h"
#include "launch/names.h"
#include "launch/sha256.h"

namespace rl::backup {
namespace {

constexpr int64_t kCheckedBackups = 2;  // backups #1 and #2 arm the rebuild check

// Copies may be asynchronous (pinned memory, CUDA); one synchronisation ends a batch of them.
void SynchronizeIfCuda(const NamedTensors& tensors) {
  const bool any_cuda = std::any_of(tensors.begin(), tensors.end(),
                                    [](const NamedTensor& t) { return t.tensor.is_cuda(); });
  if (any_cuda) c10::cuda::device_synchronize();
}

at::Tensor HostCopyLike(const at::Tensor& t) {
  return at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(t.is_cuda()));
}

}  // namespace

// ---- PinnedBackuper ---------------------------------------------------------------------------

PinnedBackuper::PinnedBackuper(SourceGetter source) : source_(std::move(source)) {}

void PinnedBackuper::Backup(const std::string& tag) {
  c10::NoGradGuard no_grad;
  const NamedTensors sources = source_();
  std::map<std::string, at::Tensor>& copies = backups_[tag];
  for (const NamedTensor& s : sources) {
    at::Tensor& host = copies[s.name];
    if (!host.defined()) host = HostCopyLike(s.tensor);  // once, at its exact size
    host.copy_(s.tensor.detach(), /*non_blocking=*/true);
  }
  SynchronizeIfCuda(sources);
}

void PinnedBackuper::Restore(const std::string& tag) {
  c10::NoGradGuard no_grad;
  const auto copies = backups_.find(tag);
  RL_CHECK(copies != backups_.end(), Error,
           "cannot restore '{}': it was never backed up (tags: {})", tag,
           FirstNames(BackupTags(), 20));
  const NamedTensors sources = source_();
  for (const NamedTensor& s : sources) {
    const auto host = copies->second.find(s.name);
    RL_CHECK(host != copies->second.end(), Error,
             "cannot restore '{}': tensor {} has no backup (the tensor set changed)", tag, s.name);
    s.tensor.detach().copy_(host->second, /*non_blocking=*/true);
  }
  SynchronizeIfCuda(sources);
}

NamedTensors PinnedBackuper::Get(const std::string& tag) {
  const auto copies = backups_.find(tag);
  RL_CHECK(copies != backups_.end(), Error, "no backup named '{}'", tag);
  NamedTensors out;
  for (const NamedTensor& s : source_()) out.push_back({s.name, copies->second.at(s.name)});
  return out;
}

std::vector<std::string> PinnedBackuper::BackupTags() const {
  std::vector<std::string> tags;
  for (const auto& [tag, copies] : backups_) tags.push_back(tag);
  return tags;
}

int64_t PinnedBackuper::HostBytes() const {
  int64_t bytes = 0;
  for (const auto& [tag, copies] : backups_) {
    for (const auto& [name, host] : copies) bytes += host.nbytes();
  }
  return bytes;
}

// ---- RematerializeBackuper -------------------------------------------------------------------

std::vector<std::string> UncoveredTensors(const NamedTensors& sources,
                                          const std::unordered_set<const void*>& in_param_buffers,
                                          const NamedTensors& extras) {
  std::unordered_set<const void*> extra_ids;
  for (const NamedTensor& e : extras) extra_ids.insert(Identity(e.tensor));
  std::vector<std::string> uncovered;
  for (const NamedTensor& s : sources) {
    const void* id = Identity(s.tensor);
    if (in_param_buffers.count(id) == 0 && extra_ids.count(id) == 0) uncovered.push_back(s.name);
  }
  return uncovered;
}

RematerializeBackuper::RematerializeBackuper(SourceGetter source, MainCastContext context)
    : source_(source), context_(std::move(context)), others_(source) {
  const NamedTensors extras = context_.extras();
  for (const NamedTensor& e : extras) extras_ids_.insert(Identity(e.tensor));
  const std::vector<std::string> uncovered =
      UncoveredTensors(source_(), context_.in_param_buffers, extras);
  RL_CHECK(uncovered.empty(), ConfigError,
           "--rematerialize-param-from-master-weight cannot restore {} tensor(s) that are neither "
           "in the optimizer's param buffers nor extras: {}. The model structure decides: a "
           "frozen parameter (--freeze-params, LoRA base) has no fp32 master to rebuild from. "
           "Drop --rematerialize-param-from-master-weight (the pinned backup covers them) or stop "
           "freezing them",
           uncovered.size(), FirstNames(uncovered));
}

std::map<std::string, std::string> RematerializeBackuper::Hashes() const {
  std::map<std::string, std::string> hashes;
  for (const NamedTensor& s : source_()) hashes[s.name] = TensorSha256(s.tensor.detach());
  return hashes;
}

void RematerializeBackuper::Backup(const std::string& tag) {
  if (tag != kActorTag) return others_.Backup(tag);
  c10::NoGradGuard no_grad;
  const NamedTensors extras = context_.extras();
  for (const NamedTensor& e : extras) {
    at::Tensor& host = extras_backup_[e.name];
    if (!host.defined()) host = HostCopyLike(e.tensor);
    host.copy_(e.tensor.detach(), /*non_blocking=*/true);
  }
  SynchronizeIfCuda(extras);
  ++backup_count_;
  expected_hashes_.clear();
  if (context_.check && backup_count_ <= kCheckedBackups) expected_hashes_ = Hashes();
}

void RematerializeBackuper::Restore(const std::string& tag) {
  if (tag != kActorTag) return others_.Restore(tag);
  RL_CHECK(backup_count_ > 0, Error, "cannot restore 'actor' before its first backup");
  c10::NoGradGuard no_grad;
  // Note [Rebuild order]: cast owned shards, all-gather (which overwrites every param-buffer
  // byte), then the extras, then one synchronisation; the same cast and gather as the step end.
  context_.cast_main_to_params();
  context_.all_gather_params();
  const NamedTensors extras = context_.extras();
  for (const NamedTensor& e : extras) {
    e.tensor.detach().copy_(extras_backup_.at(e.name), /*non_blocking=*/true);
  }
  SynchronizeIfCuda(extras);
  ++restore_count_;
  if (!expected_hashes_.empty()) Verify();
}

void RematerializeBackuper::Verify() const {
  const std::map<std::string, std::string> actual = Hashes();
  std::vector<std::string> missing, extra, differ;
  for (const auto& [name, hash] : expected_hashes_) {
    const auto it = actual.find(name);
    if (it == actual.end()) {
      missing.push_back(name);
    } else if (it->second != hash) {
      differ.push_back(name);
    }
  }
  for (const auto& [name, hash] : actual) {
    if (expected_hashes_.count(name) == 0) extra.push_back(name);
  }
  RL_CHECK(missing.empty() && extra.empty(), Error,
           "rematerialize restore changed the tensor set: missing=[{}] extra=[{}]",
           FirstNames(missing), FirstNames(extra));
  RL_CHECK(differ.empty(), Error,
           "rematerialize restore is not bit-identical to the weights at backup #{} for {}/{} "
           "tensors (restore cycle {}): {}",
           backup_count_, differ.size(), expected_hashes_.size(), restore_count_,
           FirstNames(differ));
  spdlog::info("rematerialize restore #{}: {} tensors SHA256-identical to backup #{}",
                restore_count_, expected_hashes_.size(), backup_count_);
}

NamedTensors RematerializeBackuper::Get(const std::string& tag) {
  if (tag != kActorTag) return others_.Get(tag);
  NamedTensors out;
  for (const NamedTensor& s : source_()) {
    const void* id = Identity(s.tensor);
    if (extras_ids_.count(id) != 0) {
      out.push_back({s.name, extras_backup_.at(s.name)});
    } else {
      // Covered by construction (checked in the constructor).
      out.push_back({s.name, s.tensor.detach()});
    }
  }
  return out;
}

std::vector<std::string> RematerializeBackuper::BackupTags() const {
  std::vector<std::string> tags = {kActorTag};
  for (const std::string& t : others_.BackupTags()) tags.push_back(t);
  return tags;
}

int64_t RematerializeBackuper::extras_host_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, host] : extras_backup_) bytes += host.nbytes();
  return bytes;
}

int64_t RematerializeBackuper::HostBytes() const {
  return extras_host_bytes() + others_.HostBytes();
}

}  // namespace rl::backup
