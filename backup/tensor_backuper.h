// The tensor backuper: keeps the actor's weights (and other model copies, by tag) restorable
// across the colocated sleep, in one of two ways (docs/colocated-cycle.md, step 5).
//
//  - PinnedBackuper: one pinned host copy per tag and tensor name, allocated once at its exact
//    size and reused every cycle. backup(tag) copies the live tensors to the host, restore(tag)
//    copies them back, get(tag) returns the host copies.
//  - RematerializeBackuper: tag "actor" keeps no copy of the params. restore("actor") rebuilds
//    them the way the optimizer step ended: cast the fp32 master shard into the param buffer,
//    all-gather it, then copy the "extras" (tensors with no master: fp32 params, MoE expert-bias
//    buffers) back from their pinned host copy. get("actor") returns the live param views (the
//    param buffer must be resident) and the extras' host copies. Every other tag ("ref", ...) is
//    delegated to a PinnedBackuper.
//
// The SHA256 check (Note [Rebuild check]): when armed, backup("actor") #1 and #2 hash every
// source tensor; every restore("actor") while armed recomputes and compares. A changed tensor set
// fails with "tensor set changed" (missing/extra names); a changed value with "not bit-identical"
// and the count, the cycle and the first names. Backup #3 disarms.
//
// Which tensors get("actor") returns as live views and which as host copies is decided by the
// model's structure (buffer membership), never by memory state, so it is the same on every rank.
//
// Thread safety: none; the trainer's main thread drives it. Restores and rebuilds are collective
// (the all-gather) and must be called on every rank in the same order.
#ifndef RL_BACKUP_TENSOR_BACKUPER_H_
#define RL_BACKUP_TENSOR_BACKUPER_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "launch/named_tensors.h"

namespace rl::backup {

// Returns the live tensors, in a fixed order, every call the same objects.
using SourceGetter = std::function<NamedTensors()>;

inline constexpr const char* kActorTag = "actor";
inline constexpr const char* kRefTag = "ref";  // the reference model (KL loss)

class TensorBackuper {
 public:
  virtual ~TensorBackuper() = default;
  virtual void Backup(const std::string& tag) = 0;
  virtual void Restore(const std::string& tag) = 0;
  // Named tensors for the weight sync (see the variants for live vs host copies).
  virtual NamedTensors Get(const std::string& tag) = 0;
  virtual std::vector<std::string> BackupTags() const = 0;
  // Pinned host bytes held (allocated once, so this only grows on the first backup of a tag).
  virtual int64_t HostBytes() const = 0;
};

class PinnedBackuper final : public TensorBackuper {
 public:
  explicit PinnedBackuper(SourceGetter source);
  void Backup(const std::string& tag) override;
  void Restore(const std::string& tag) override;
  NamedTensors Get(const std::string& tag) override;
  std::vector<std::string> BackupTags() const override;
  int64_t HostBytes() const override;

 private:
  SourceGetter source_;
  std::map<std::string, std::map<std::string, at::Tensor>> backups_;  // tag -> name -> host copy
};

// How the rematerialize variant rebuilds the actor: the optimizer's step-end calls, and what is
// not covered by them.
struct MainCastContext {
  std::function<void()> cast_main_to_params;
  std::function<void()> all_gather_params;
  // Tensors with no master (fp32 params, expert-bias buffers); backed up to pinned host memory.
  SourceGetter extras;
  // Identities (TensorImpl*) of the source tensors that live in the param buffers.
  std::unordered_set<const void*> in_param_buffers;
  bool check = false;  // the SHA256 rebuild check
};

class RematerializeBackuper final : public TensorBackuper {
 public:
  // Throws ConfigError naming the uncovered source tensors (first 10 and the count) when a source
  // tensor is neither in the param buffers nor an extra (Note [Rematerialize coverage]).
  RematerializeBackuper(SourceGetter source, MainCastContext context);
  void Backup(const std::string& tag) override;
  void Restore(const std::string& tag) override;
  NamedTensors Get(const std::string& tag) override;
  std::vector<std::string> BackupTags() const override;
  int64_t HostBytes() const override;

  bool check_armed() const { return !expected_hashes_.empty(); }
  int64_t extras_host_bytes() const;

 private:
  std::map<std::string, std::string> Hashes() const;
  void Verify() const;

  SourceGetter source_;
  MainCastContext context_;
  PinnedBackuper others_;
  std::map<std::string, at::Tensor> extras_backup_;  // name -> pinned host copy
  std::unordered_set<const void*> extras_ids_;
  int64_t backup_count_ = 0;
  int64_t restore_count_ = 0;
  std::map<std::string, std::string> expected_hashes_;  // empty when disarmed
};

// Note [Rematerialize coverage]: every source tensor must be in a param buffer or an extra.
// Returns the names that are neither, in source order.
std::vector<std::string> UncoveredTensors(const NamedTensors& sources,
                                          const std::unordered_set<const void*>& in_param_buffers,
                                          const NamedTensors& extras);

// The identity used for coverage and extras matching.
inline const void* Identity(const at::Tensor& t) { return t.unsafeGetTensorImpl(); }

}  // namespace rl::backup

#endif  // RL_BACKUP_TENSOR_BACKUPER_H_
