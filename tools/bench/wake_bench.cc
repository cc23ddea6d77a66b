// wake_bench [--model-config FILE] [--cycles N]: the actor's wake-up on one GPU, for a GLM-5-shaped
// model at real widths (default configs/models/glm5_744b_a40b_bench.json: the 3 dense layers of
// GLM-5 and its embeddings, 3.07 B params, a 6.1 GB bf16 param buffer), measured in one process:
//   1. restore by rematerialize (cast of the fp32 master shard + all-gather + extras) vs restore
//      from the pinned host copy, and the ratio; the cast alone as a fraction of HBM bandwidth
//      (bytes read + written / time / 4.8 TB/s);
//   2. pinned host bytes of each path while the actor sleeps, and the process RSS;
//   3. weight sync into an engine layout on the same GPU, bytes/s per bucket size.
// Run on the GPU machine: mpirun -np 1 wake_bench (see README).
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>

#include "backup/tensor_backuper.h"
#include "launch/communicator.h"
#include "launch/device.h"
#include "launch/json.h"
#include "launch/mpi_session.h"
#include "optimizer/distributed_optimizer.h"
#include "trainer/memory/process_memory.h"
#include "trainer/model/hf_config.h"
#include "trainer/model/params.h"
#include "weight_sync/engine_layout.h"
#include "weight_sync/weight_sync.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kHbmBytesPerSecond = 4.8e12;  // H200 peak

double BestSeconds(const std::function<void()>& fn, int cycles) {
  double best = 1e30;
  for (int i = 0; i < cycles; ++i) {
    c10::cuda::device_synchronize();
    const auto start = Clock::now();
    fn();
    c10::cuda::device_synchronize();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  rl::MpiSession session(&argc, &argv);
  CLI::App app{"Wake-up benchmark: rematerialize vs pinned restore, cast bandwidth, weight sync."};
  std::string model_config = "configs/models/glm5_744b_a40b_bench.json";
  int cycles = 5;
  app.add_option("--model-config", model_config, "config.json of the model");
  app.add_option("--cycles", cycles, "timed repetitions; the best counts");
  CLI11_PARSE(app, argc, argv);

  const c10::Device device = rl::BindDevice(session.local_rank(),
                                            rl::DevicePreference::kCudaIfAvailable);
  if (!device.is_cuda()) {
    std::fprintf(stderr, "wake_bench needs a GPU\n");
    return 1;
  }
  auto comm = rl::CreateCommunicator(session, device, rl::CommOptions{});
  const rl::model::ModelConfig config =
      rl::model::ParseModelConfig(rl::json::ParseFile(model_config), model_config);
  const std::vector<rl::ParamSpec> specs = rl::model::ListParams(config);

  std::vector<rl::ParamSpec> trained;
  rl::NamedTensors extras;
  for (const auto& s : specs) {
    if (s.role == rl::ParamRole::kFp32Extra) {
      extras.push_back({s.name, at::zeros(s.shape, at::TensorOptions().dtype(at::kFloat).device(device))});
    } else {
      trained.push_back(s);
    }
  }
  rl::optimizer::DistributedOptimizer optimizer(trained, *comm, at::kBFloat16, device, {},
                                                rl::optimizer::PlainAllocator(device));
  for (rl::optimizer::BufferKind kind : rl::optimizer::kBufferKinds) {
    optimizer.param_buffer(kind).normal_(0.0, 0.02);
  }
  optimizer.InitMastersFromParams();
  int64_t params = 0;
  for (const auto& p : trained) params += p.numel();
  const int64_t param_buffer_bytes =
      optimizer.param_buffer(rl::optimizer::BufferKind::kDense).nbytes() +
      optimizer.param_buffer(rl::optimizer::BufferKind::kExpert).nbytes();

  const rl::backup::SourceGetter source = [&] {
    rl::NamedTensors out;
    for (const auto& p : trained) out.push_back({p.name, optimizer.params().at(p.name)});
    for (const auto& e : extras) out.push_back(e);
    return out;
  };
  rl::backup::MainCastContext context;
  context.cast_main_to_params = [&] { optimizer.CastMainToParams(); };
  context.all_gather_params = [&] { optimizer.AllGatherParams(); };
  context.extras = [&] { return extras; };
  for (const auto& [name, t] : optimizer.params()) context.in_param_buffers.insert(rl::backup::Identity(t));
  rl::backup::RematerializeBackuper remat(source, context);
  rl::backup::PinnedBackuper pinned(source);
  const int64_t rss_before = rl::memory::ProcessRssBytes();
  remat.Backup(rl::backup::kActorTag);
  const int64_t rss_remat = rl::memory::ProcessRssBytes();
  pinned.Backup(rl::backup::kActorTag);
  const int64_t rss_pinned = rl::memory::ProcessRssBytes();

  const double remat_s = BestSeconds([&] { remat.Restore(rl::backup::kActorTag); }, cycles);
  const double pinned_s = BestSeconds([&] { pinned.Restore(rl::backup::kActorTag); }, cycles);
  const double cast_s = BestSeconds([&] { optimizer.CastMainToParams(); }, cycles);
  const double cast_bytes = static_cast<double>(params) * (4 + 2);  // fp32 read, bf16 write

  std::printf("model %s: %lld trained params, param buffer %.2f GiB (bf16), %s\n",
              model_config.c_str(), static_cast<long long>(params),
              param_buffer_bytes / 1073741824.0, device.str().c_str());
  std::printf("1. wake: rematerialize %.3f ms, pinned restore %.3f ms, ratio %.1fx\n",
              remat_s * 1e3, pinned_s * 1e3, pinned_s / remat_s);
  std::printf("   cast alone %.3f ms = %.2f TB/s = %.0f%% of 4.8 TB/s HBM peak\n", cast_s * 1e3,
              cast_bytes / cast_s / 1e12, 100 * cast_bytes / cast_s / kHbmBytesPerSecond);
  std::printf("   pinned host copy H2D: %.1f GB/s\n", param_buffer_bytes / pinned_s / 1e9);
  std::printf("2. host pinned bytes while asleep: rematerialize %lld B, pinned %lld B (%.2f GiB more)\n",
              static_cast<long long>(remat.HostBytes()), static_cast<long long>(pinned.HostBytes()),
              (pinned.HostBytes() - remat.HostBytes()) / 1073741824.0);
  std::printf("   process RSS: %.2f GiB before backups, %.2f GiB after the rematerialize backup, "
              "%.2f GiB after the pinned one\n",
              rss_before / 1073741824.0, rss_remat / 1073741824.0, rss_pinned / 1073741824.0);

  // 3. Weight sync from the live params into an engine layout on the same GPU.
  std::vector<rl::weight_sync::TensorDecl> decls;
  for (const auto& s : specs) {
    decls.push_back({s.name, s.shape, rl::model::ParamDtype(s, at::kBFloat16)});
  }
  const rl::weight_sync::EngineLayout layout = rl::weight_sync::MakeEngineLayout(decls);
  const at::Tensor storage =
      at::empty({layout.total_bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  rl::NamedTensors actor;
  for (const auto& t : remat.Get(rl::backup::kActorTag)) {
    actor.push_back({t.name, t.tensor.to(device)});
  }
  for (int64_t bucket_mib : {64, 512, 2048}) {
    rl::weight_sync::SyncStats stats;
    const double s = BestSeconds(
        [&] { stats = rl::weight_sync::Sync(actor, layout, storage, bucket_mib << 20); }, cycles);
    std::printf("3. weight sync, bucket %lld MiB: %.2f GiB in %.3f ms = %.2f TB/s (%lld buckets)\n",
                static_cast<long long>(bucket_mib), stats.num_bytes / 1073741824.0, s * 1e3,
                stats.num_bytes / s / 1e12, static_cast<long long>(stats.num_buckets));
  }
  rl::weight_sync::CheckWeightsEqual(actor, layout, storage);
  std::printf("   engine weights SHA256-equal to the actor's after the sync\n");
  return 0;
}
