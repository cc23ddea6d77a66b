#include "trainer/rank_layout.h"

#include <fmt/format.h>
#include <mpi.h>

#include <array>
#include <cstring>

#include "launch/check.h"

namespace rl {
namespace {
constexpr int kFieldBytes = 64;  // host and device names are cut to this length
}

std::vector<RankInfo> GatherRankLayout(const MpiSession& session, c10::Device device) {
  struct Packed {
    int rank;
    int local_rank;
    std::array<char, kFieldBytes> host;
    std::array<char, kFieldBytes> device;
  };
  Packed mine{};
  mine.rank = session.rank();
  mine.local_rank = session.local_rank();
  std::strncpy(mine.host.data(), session.host().c_str(), kFieldBytes - 1);
  std::strncpy(mine.device.data(), device.str().c_str(), kFieldBytes - 1);

  std::vector<Packed> all(session.world_size());
  RL_CHECK_MPI(MPI_Allgather(&mine, sizeof(Packed), MPI_BYTE, all.data(), sizeof(Packed),
                             MPI_BYTE, session.world()));
  std::vector<RankInfo> layout;
  layout.reserve(all.size());
  for (const Packed& p : all) {
    layout.push_back({p.rank, p.local_rank, std::string(p.host.data()),
                      std::string(p.device.data())});
  }
  return layout;
}

std::string FormatRankLayout(const std::vector<RankInfo>& layout) {
  std::string out;
  for (const RankInfo& info : layout) {
    out += fmt::format("  rank {:<4} local {:<3} host {:<24} device {}\n", info.rank,
                       info.local_rank, info.host, info.device);
  }
  if (!out.empty()) out.pop_back();
  return out;
}

}  // namespace rl
