// The backuper on one process, with a fake optimizer whose "step end" is a cast of fp32 masters
// into a bf16 param buffer (the all-gather is the identity on one rank).
#include "backup/tensor_backuper.h"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <limits>
#include <string>

#include "launch/check.h"

namespace rl::backup {
namespace {

bool Contains(const std::string& text, const std::string& piece) {
  return text.find(piece) != std::string::npos;
}

// Two bf16 params as views of one buffer, an fp32 extra, and the fp32 masters of the buffer.
struct FakeActor {
  at::Tensor buffer = at::zeros({96}, at::kBFloat16);
  at::Tensor masters = at::randn({96}, at::kFloat);
  at::Tensor w1 = buffer.narrow(0, 0, 64).view({8, 8});
  at::Tensor w2 = buffer.narrow(0, 64, 32);
  at::Tensor bias = at::randn({4}, at::kFloat);  // e_score_correction_bias: no master
  at::Tensor frozen;                             // set to make coverage fail

  FakeActor() { buffer.copy_(masters); }
  NamedTensors Sources() const {
    NamedTensors s = {{"w1", w1}, {"w2", w2}, {"gate.e_score_correction_bias", bias}};
    if (frozen.defined()) s.push_back({"frozen.weight", frozen});
    return s;
  }
  MainCastContext Context(bool check) {
    MainCastContext c;
    c.cast_main_to_params = [this] { buffer.copy_(masters); };
    c.all_gather_params = [] {};
    c.extras = [this] { return NamedTensors{{"gate.e_score_correction_bias", bias}}; };
    c.in_param_buffers = {Identity(w1), Identity(w2)};
    c.check = check;
    return c;
  }
  void Corrupt() {
    buffer.fill_(std::numeric_limits<float>::quiet_NaN());
    bias.fill_(std::numeric_limits<float>::quiet_NaN());
  }
  at::Tensor Snapshot() const { return at::cat({buffer.to(at::kFloat), bias}); }
};

TEST_CASE("rematerialize: contents destroyed after backup are rebuilt bit-identically") {
  FakeActor actor;
  RematerializeBackuper backuper([&] { return actor.Sources(); }, actor.Context(true));
  backuper.Backup(kActorTag);
  const at::Tensor before = actor.Snapshot();
  actor.Corrupt();
  backuper.Restore(kActorTag);  // verifies the hashes of backup #1
  CHECK(at::equal(actor.Snapshot(), before));
}

TEST_CASE("rematerialize: get returns live param views and host copies of the extras") {
  FakeActor actor;
  RematerializeBackuper backuper([&] { return actor.Sources(); }, actor.Context(false));
  backuper.Backup(kActorTag);
  const NamedTensors got = backuper.Get(kActorTag);
  REQUIRE(got.size() == 3);
  CHECK(got[0].tensor.data_ptr() == actor.w1.data_ptr());
  CHECK(got[1].tensor.data_ptr() == actor.w2.data_ptr());
  CHECK(got[2].tensor.data_ptr() != actor.bias.data_ptr());
  CHECK(at::equal(got[2].tensor, actor.bias));
}

TEST_CASE("rematerialize: a master changed after backup fails the check naming the tensor") {
  FakeActor actor;
  RematerializeBackuper backuper([&] { return actor.Sources(); }, actor.Context(true));
  backuper.Backup(kActorTag);
  actor.masters[70] += 1.0f;  // inside w2
  try {
    backuper.Restore(kActorTag);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(Contains(e.what(), "not bit-identical"));
    CHECK(Contains(e.what(), "1/3 tensors"));
    CHECK(Contains(e.what(), "w2"));
    CHECK_FALSE(Contains(e.what(), "w1"));
  }
}

TEST_CASE("rematerialize: a changed tensor set fails the check") {
  FakeActor actor;
  RematerializeBackuper backuper([&] { return actor.Sources(); }, actor.Context(true));
  backuper.Backup(kActorTag);
  // A tensor appears after the backup (covered, so the constructor's check is not what fails).
  actor.frozen = actor.buffer.narrow(0, 0, 4);
  try {
    backuper.Restore(kActorTag);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(Contains(e.what(), "changed the tensor set"));
    CHECK(Contains(e.what(), "extra=[frozen.weight]"));
  }
}

TEST_CASE("rematerialize: backups 1 and 2 arm the check, backup 3 disarms it") {
  FakeActor actor;
  RematerializeBackuper armed([&] { return actor.Sources(); }, actor.Context(true));
  armed.Backup(kActorTag);
  CHECK(armed.check_armed());
  armed.Backup(kActorTag);
  CHECK(armed.check_armed());
  armed.Backup(kActorTag);
  CHECK_FALSE(armed.check_armed());
  RematerializeBackuper unchecked([&] { return actor.Sources(); }, actor.Context(false));
  unchecked.Backup(kActorTag);
  CHECK_FALSE(unchecked.check_armed());
}

TEST_CASE("rematerialize: a tensor in no param buffer and no extra stops construction") {
  FakeActor actor;
  actor.frozen = at::zeros({3}, at::kBFloat16);  // a frozen param: not in a buffer, no master
  try {
    RematerializeBackuper backuper([&] { return actor.Sources(); }, actor.Context(true));
    FAIL("no throw");
  } catch (const ConfigError& e) {
    CHECK(Contains(e.what(), "cannot restore 1 tensor(s)"));
    CHECK(Contains(e.what(), "frozen.weight"));
    CHECK(Contains(e.what(), "model structure decides"));
  }
}

TEST_CASE("rematerialize: pins only the extras; other tags get full pinned copies") {
  FakeActor actor;
  RematerializeBackuper backuper([&] { return actor.Sources(); }, actor.Context(false));
  backuper.Backup(kActorTag);
  CHECK(backuper.HostBytes() == 4 * 4);  // the fp32 extra only
  backuper.Backup("ref");
  CHECK(backuper.BackupTags() == std::vector<std::string>{"actor", "ref"});
  CHECK(backuper.HostBytes() == 4 * 4 + 2 * 96 + 4 * 4);
  // Switch to the ref weights and back: the actor restore rebuilds from the (changed) masters.
  actor.masters.add_(1.0f);  // the actor trained on after the ref backup
  backuper.Restore("ref");
  CHECK_FALSE(at::equal(actor.buffer, actor.masters.to(at::kBFloat16)));
  backuper.Restore(kActorTag);
  CHECK(at::equal(actor.buffer, actor.masters.to(at::kBFloat16)));
}

TEST_CASE("pinned: round trip is bit-identical, 2 bytes per bf16 param, allocated once") {
  FakeActor actor;
  PinnedBackuper backuper([&] { return actor.Sources(); });
  backuper.Backup(kActorTag);
  const void* host_ptr = backuper.Get(kActorTag)[0].tensor.data_ptr();
  CHECK(backuper.HostBytes() == 2 * 96 + 4 * 4);
  const at::Tensor before = actor.Snapshot();
  actor.Corrupt();
  backuper.Restore(kActorTag);
  CHECK(at::equal(actor.Snapshot(), before));
  backuper.Backup(kActorTag);
  CHECK(backuper.Get(kActorTag)[0].tensor.data_ptr() == host_ptr);
  CHECK(backuper.HostBytes() == 2 * 96 + 4 * 4);
  CHECK_THROWS_AS(backuper.Restore("never"), Error);
}

}  // namespace
}  // namespace rl::backup
