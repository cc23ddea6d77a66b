// decode_floor_bench [--batch 64] [--keys 192] [--hbm-tb-s 4.8] [--layers 28] [--hidden 1024]
//   [--intermediate 3072] [--q-heads 16] [--kv-heads 8] [--head-dim 128] [--vocab 151936]:
// how fast a dense decode step could be with the engine's kernels per layer, or as one persistent
// kernel, whatever they compute, on the GPU, in one process (Note [Decode floor] below). Defaults:
// Qwen3-0.6B's shape at batch 64 with 192 cached positions a row, the mean of decode_bench's
// Generate of a 128-token prompt and 128 new tokens. Prints one line per figure; needs a GPU.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "launch/check.h"
#include "launch/device.h"
#include "tools/bench/floor_kernels.h"
#include "tools/bench/profiling.h"
#include "trainer/kernels/cuda_kernels.h"

// Note [Decode floor]
// A decode step at 33 to 64 rows runs 7 kernels a dense layer (Note [Decode kernels] in
// trainer/model/layers.cc): AddRmsNorm, the q/k/v GEMM, the attention, the o GEMM, AddRmsNorm,
// the gate/up GEMM with SiluMul, the down GEMM; and 4 more a step (the embedding, the last norm,
// the LM head, sampling). Each must read its bytes (its weights, or the KV cache) and each starts
// only once the one ahead has written its output. This benchmark replaces every kernel of such a
// step by one that reads the same number of bytes from HBM and does nothing else (ReadKernel,
// tools/bench/floor_kernels.h), chained in one CUDA graph as the step's kernels are, every
// kernel reading memory no other reads (so nothing comes from the L2), by plain and by
// programmatic dependent launch. Its time is what the boundaries between dependent kernels, their
// ramps and tails and the bytes cost together with no arithmetic and no dependent round trips
// inside a kernel: a floor for the engine's kernels as far as this simple read kernel (a
// grid-stride loop, a round of loads a thread) reads as fast as any would. The norms count as
// reading the split-k GEMM's 4 fp32 partial sums and the residual, the last norm a bf16 row
// (the first layer's reads a bf16 row and the last one partial sums: the same total). It also
// times the same chains with 5 kernels a layer (both norms folded into the GEMMs behind them) and
// the boundaries alone (EmptyKernel); the attention's reads alone in its blocks' shape
// (CacheReadKernel: a block a key/value head and row); and, for each GEMM, at::mm of the step's
// rows against a kernel reading its weights (each over --layers copies of its weight in turn, the
// LM head over 4, so from HBM). Each chain's roofline fraction is the weights and the KV cache
// over its time at --hbm-tb-s, as decode_bench counts them but for decode_bench's exact mean
// length and norm weights (within 0.2% at the defaults); the chains also read the norms' inputs
// and the logits, which the roofline leaves out (86 MB a step at the defaults). Last, the same
// steps as one persistent kernel, whose phases also hand their outputs on through the L2, with
// its costs taken apart (Note [Decode floor, persistent] in floor_kernels.cu).

namespace {

constexpr int64_t kBf16 = 2;

struct Gemm;

// What a kernel of the step reads: a norm reads what the kernel ahead wrote, the attention the
// cache, a GEMM its weights, and the step's ends each their own.
enum class Kind { kNorm, kAttention, kGemm, kEnd };

struct Read {
  const char* name;
  int64_t bytes;
  Kind kind;
  const Gemm* gemm = nullptr;  // a GEMM's shape
};

// A projection's weight [n, k] in bf16, timed over `copies` copies of it in turn.
struct Gemm {
  const char* name;
  int64_t n, k, copies;
  Read read() const { return {name, n * k * kBf16, Kind::kGemm, this}; }
};

int64_t RoundUp16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

int Run(int argc, char** argv) {
  CLI::App app{"Decode floor: a step of kernels that only read their bytes."};
  int64_t batch = 64, keys = 192, layers = 28, hidden = 1024, intermediate = 3072, q_heads = 16,
          kv_heads = 8, head_dim = 128, vocab = 151936;
  double hbm_tb_s = 4.8;
  app.add_option("--batch", batch, "rows of the step");
  app.add_option("--keys", keys, "cached positions a row reads");
  app.add_option("--hbm-tb-s", hbm_tb_s, "HBM bandwidth for the roofline, TB/s");
  app.add_option("--layers", layers, "decoder layers");
  app.add_option("--hidden", hidden, "hidden size");
  app.add_option("--intermediate", intermediate, "MLP intermediate size");
  app.add_option("--q-heads", q_heads, "query heads");
  app.add_option("--kv-heads", kv_heads, "key/value heads");
  app.add_option("--head-dim", head_dim, "head dimension");
  app.add_option("--vocab", vocab, "vocabulary size");
  CLI11_PARSE(app, argc, argv);
  if (rl::BindDevice(0, rl::DevicePreference::kCudaIfAvailable).type() != c10::DeviceType::CUDA) {
    std::fprintf(stderr, "decode_floor_bench: needs a GPU\n");
    return 1;
  }
  // The reads of one layer's kernels, in the step's order (bf16 weights and cache; the norms read
  // the split-k GEMM's 4 fp32 partial sums and the residual).
  const int64_t norm = 4 * batch * hidden * 4 + batch * hidden * kBf16;
  const Gemm qkv_w{"q/k/v", (q_heads + 2 * kv_heads) * head_dim, hidden, layers};
  const Gemm o_w{"o", hidden, q_heads * head_dim, layers};
  const Gemm gate_up_w{"gate/up", 2 * intermediate, hidden, layers};
  const Gemm down_w{"down", hidden, intermediate, layers};
  const Gemm lm_head_w{"LM head", vocab, hidden, 4};  // 311 MB each at the defaults
  const Read qkv = qkv_w.read(), o = o_w.read(), gate_up = gate_up_w.read(), down = down_w.read(),
             lm_head = lm_head_w.read();
  const Read attention{"attention", 2 * batch * kv_heads * keys * head_dim * kBf16,
                       Kind::kAttention};
  const Read norm_read{"norm", norm, Kind::kNorm};
  const std::vector<Read> layer7{norm_read, qkv, attention, o, norm_read, gate_up, down};
  const std::vector<Read> layer5{qkv, attention, o, gate_up, down};
  const std::vector<Read> ends{{"embedding", batch * hidden * kBf16, Kind::kEnd},
                               {"norm", batch * hidden * kBf16, Kind::kEnd},
                               lm_head,
                               {"sampling", batch * vocab * kBf16, Kind::kEnd}};
  const double roofline_bytes = static_cast<double>(
      layers * (qkv.bytes + attention.bytes + o.bytes + gate_up.bytes + down.bytes) +
      lm_head.bytes + batch * hidden * kBf16);
  const double roofline_us = roofline_bytes / (hbm_tb_s * 1e6);

  const at::TensorOptions bytes_on_gpu = at::TensorOptions().dtype(at::kByte).device(at::kCUDA);
  const at::Tensor sink = at::zeros({4}, bytes_on_gpu);
  unsigned* sink_ptr = reinterpret_cast<unsigned*>(sink.data_ptr());
  const auto stream = [] { return c10::cuda::getCurrentCUDAStream().stream(); };

  // A step's chain: every read in its own memory.
  const auto step_reads = [&](const std::vector<Read>& layer) {
    std::vector<int64_t> sizes;
    sizes.push_back(RoundUp16(ends[0].bytes));
    for (int64_t l = 0; l < layers; ++l) {
      for (const Read& r : layer) sizes.push_back(RoundUp16(r.bytes));
    }
    for (size_t i = 1; i < ends.size(); ++i) sizes.push_back(RoundUp16(ends[i].bytes));
    return sizes;
  };
  bool refused = false;  // a driver or stream refused programmatic launch: those ran plain
  const auto time_chain = [&](const std::vector<int64_t>& sizes, bool reads, bool programmatic) {
    int64_t total = 0;
    for (const int64_t s : sizes) total += s;
    const at::Tensor pool = at::ones({reads ? total : 16}, bytes_on_gpu);
    const char* base = static_cast<const char*>(pool.data_ptr());
    return rl::bench::GraphMicrosPerCall(
        [&] {
          const rl::kernels::ProgrammaticLaunch scope(programmatic);
          int64_t at = 0;
          for (const int64_t s : sizes) {
            RL_CHECK_CUDA(reads ? rl::bench::ReadKernel(base + at, s, sink_ptr, stream())
                                : rl::bench::EmptyKernel(stream()));
            at += s;
          }
          refused = refused || (programmatic && !rl::kernels::ProgrammaticLaunch::On());
        },
        3);
  };
  std::printf("roofline: %.1f MB a step, %.1f us at %.2f TB/s\n", roofline_bytes / 1e6, roofline_us,
              hbm_tb_s);
  for (const auto& [label, layer] : {std::pair<const char*, std::vector<Read>>{"7", layer7},
                                     std::pair<const char*, std::vector<Read>>{"5", layer5}}) {
    const std::vector<int64_t> sizes = step_reads(layer);
    for (const bool programmatic : {false, true}) {
      const double empty = time_chain(sizes, false, programmatic);
      const double full = time_chain(sizes, true, programmatic);
      std::printf(
          "%s kernels a layer (%zu a step), %s launch: boundaries alone %.1f us (%.2f us a "
          "kernel); reads %.1f us, %.1f%% of the roofline\n",
          label, sizes.size(), programmatic ? "programmatic" : "plain", empty,
          empty / static_cast<double>(sizes.size()), full, 100.0 * roofline_us / full);
    }
  }
  if (refused) std::printf("programmatic launch was refused: those chains ran plain\n");

  // The attention's cache in its blocks' shape (capacity 256 positions a row, as a Generate of a
  // 128-token prompt and 128 new tokens holds), caches of 8 layers in turn so that each launch
  // reads from HBM.
  {
    const int64_t capacity = std::max<int64_t>(256, keys);
    const int64_t copies = 8;
    const at::Tensor cache = at::ones({copies, 2, batch, kv_heads, capacity, head_dim},
                                      at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA));
    for (const int threads : {128, 256}) {
      int64_t next = 0;
      const double us = rl::bench::GraphMicrosPerCall(
          [&] {
            const at::Tensor layer = cache[next++ % copies];
            RL_CHECK_CUDA(rl::bench::CacheReadKernel(layer[0].data_ptr(), layer[1].data_ptr(),
                                                     batch, kv_heads, capacity, keys, head_dim,
                                                     threads, sink_ptr, stream()));
          },
          static_cast<int>(4 * copies));
      std::printf(
          "the attention's cache read by %lld blocks of %d threads (a block a head and row): "
          "%.2f us, %.2f TB/s\n",
          static_cast<long long>(batch * kv_heads), threads, us, attention.bytes / us / 1e6);
    }
  }

  // Each GEMM at the step's rows against a kernel reading its weights, over its copies.
  for (const Gemm& g : {qkv_w, o_w, gate_up_w, down_w, lm_head_w}) {
    const int64_t copies = g.copies;
    const at::Tensor weights =
        at::randn({copies, g.n, g.k}, at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA));
    const at::Tensor x = at::randn({batch, g.k}, weights.options());
    const int64_t bytes = g.read().bytes;
    int64_t next = 0;
    const double mm = rl::bench::GraphMicrosPerCall(
        [&] {
          at::mm(x, weights[next % copies].t());
          ++next;
        },
        static_cast<int>(copies));
    const double read = rl::bench::GraphMicrosPerCall(
        [&] {
          RL_CHECK_CUDA(
              rl::bench::ReadKernel(weights[next % copies].data_ptr(), bytes, sink_ptr, stream()));
          ++next;
        },
        static_cast<int>(copies));
    std::printf(
        "%s [%lld x %lld] at %lld rows: at::mm %.2f us, reading its weights %.2f us (%.2f TB/s), "
        "the bytes at %.2f TB/s %.2f us\n",
        g.name, static_cast<long long>(g.n), static_cast<long long>(g.k),
        static_cast<long long>(batch), mm, read, bytes / read / 1e6, hbm_tb_s,
        bytes / (hbm_tb_s * 1e6));
  }

  // The same steps as one persistent kernel (Note [Decode floor, persistent] in floor_kernels.cu).
  // Its phases read what the chains read, and besides what a phase hands the next through the L2:
  // a GEMM phase is tiled as such a kernel would tile it, 128 outputs a tile and k split in up to
  // k / 256 slices so that the tiles fill the grid; each block reads its slice of x (bf16) and
  // writes fp32 partial sums, which the phase behind reads (its share of them) with the residual.
  {
    const int64_t blocks = rl::bench::PersistentReadBlocks();
    const auto plan = [&](const std::vector<Read>& layer) {
      std::vector<rl::bench::FloorPhase> phases;
      int64_t offset = 0, handed = 0;  // bytes the last phase wrote for the next
      const auto add = [&](int64_t own, int64_t input_each, int64_t output) {
        phases.push_back({offset, RoundUp16(own), static_cast<int32_t>(RoundUp16(input_each)),
                          static_cast<int32_t>(RoundUp16((output + blocks - 1) / blocks))});
        offset += RoundUp16(own);
        handed = output;
      };
      const auto gemm = [&](const Gemm& g) {
        const int64_t slices =
            std::clamp<int64_t>((blocks * 128 + g.n - 1) / g.n, 1, std::max<int64_t>(1, g.k / 256));
        add(g.read().bytes, batch * (g.k / slices) * kBf16, batch * g.n * 4 * slices);
      };
      // A phase that reads its share of what the one ahead wrote (a norm: and of the residual).
      const auto handed_on = [&](int64_t own, int64_t residual, int64_t output) {
        add(own, (handed + residual) / blocks, output);
      };
      const int64_t row = batch * hidden * kBf16;
      add(ends[0].bytes, 0, row);  // the embedding
      for (int64_t l = 0; l < layers; ++l) {
        for (const Read& r : layer) {
          switch (r.kind) {
            case Kind::kNorm:
              handed_on(0, row, 2 * row);
              break;
            case Kind::kAttention:
              handed_on(r.bytes, 0, batch * q_heads * head_dim * kBf16);
              break;
            case Kind::kGemm:
              gemm(*r.gemm);
              break;
            case Kind::kEnd:
              break;
          }
        }
      }
      handed_on(0, row, row);  // the last norm
      gemm(lm_head_w);
      handed_on(0, 0, batch * 4);  // sampling: its share of the logits
      return std::pair(phases, offset);
    };
    using rl::bench::FloorPhase;
    using Ring = rl::bench::PersistentRing;
    using Wait = rl::bench::PersistentWait;
    const at::Tensor scratch = at::zeros({64 << 20}, bytes_on_gpu);
    const auto time_persistent = [&](const std::vector<FloorPhase>& phases, int64_t pool_bytes,
                                     Ring ring) {
      const at::Tensor pool = at::ones({pool_bytes}, bytes_on_gpu);
      const at::Tensor on_gpu =
          at::from_blob(const_cast<FloorPhase*>(phases.data()),
                        {static_cast<int64_t>(phases.size() * sizeof(FloorPhase))}, at::kByte)
              .to(at::kCUDA);
      const at::Tensor counters =
          at::zeros({rl::bench::PersistentCounterWords(static_cast<int>(phases.size()))},
                    bytes_on_gpu.dtype(at::kInt));
      return rl::bench::GraphMicrosPerCall(
          [&] {
            RL_CHECK_CUDA(rl::bench::PersistentReadKernel(
                pool.data_ptr(), static_cast<const FloorPhase*>(on_gpu.data_ptr()),
                static_cast<int>(phases.size()), scratch.data_ptr(), scratch.numel(),
                static_cast<unsigned*>(counters.data_ptr()), ring, sink_ptr, stream()));
          },
          3);
    };
    const auto report = [&](const std::string& what, Ring ring, double us) {
      std::printf(
          "one persistent kernel of %lld blocks, %s, a ring of %d x 16 KiB, %s%s, waits on %s: "
          "%.1f us, %.1f%% of the roofline\n",
          static_cast<long long>(blocks), what.c_str(), ring.slots,
          ring.lookahead ? "copies ahead of the phases" : "copies after the phase ahead",
          ring.read_slots ? "" : ", slots freed unread",
          ring.wait == Wait::kCounter ? "a counter"
          : ring.wait == Wait::kFlag  ? "a flag"
                                      : "a tree of counters",
          us, 100.0 * roofline_us / us);
    };
    for (const auto& [label, layer] : {std::pair<const char*, std::vector<Read>>{"7", layer7},
                                       std::pair<const char*, std::vector<Read>>{"5", layer5}}) {
      const auto [phases, pool_bytes] = plan(layer);
      const std::string what =
          std::string(label) + " phases a layer (" + std::to_string(phases.size()) + " a step)";
      for (const Ring ring : {Ring{13, false}, Ring{4, true}, Ring{13, true}}) {
        report(what, ring, time_persistent(phases, pool_bytes, ring));
      }
      if (layer.size() != layer7.size()) continue;
      // Where the time goes: the phases without what they hand on, the waits alone, and the
      // step's own bytes as one phase.
      std::vector<FloorPhase> own_only = phases, waits_only = phases;
      for (FloorPhase& p : own_only) p.input_bytes = p.output_bytes = 0;
      for (FloorPhase& p : waits_only) p = {0, 0, 0, 0};
      const Ring ring{13, true};
      report(what + " without their inputs and outputs", ring,
             time_persistent(own_only, pool_bytes, ring));
      const Ring unread{13, true, false};
      report(what + " without their inputs and outputs", unread,
             time_persistent(own_only, pool_bytes, unread));
      for (const Wait wait : {Wait::kCounter, Wait::kFlag, Wait::kTree}) {
        const Ring waiting{13, true, true, wait};
        report(what + " without any bytes (the waits alone)", waiting,
               time_persistent(waits_only, 16, waiting));
        if (wait == Wait::kCounter) continue;
        report(what + " without their inputs and outputs", waiting,
               time_persistent(own_only, pool_bytes, waiting));
        report(what, waiting, time_persistent(phases, pool_bytes, waiting));
      }
      report("the step's own bytes as one phase", ring,
             time_persistent({{0, pool_bytes, 0, 0}}, pool_bytes, ring));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decode_floor_bench: %s\n", e.what());
    return 1;
  }
}
