// Which rank runs where: gathered from every rank at start-up and printed by rank 0.
#ifndef RL_TRAINER_RANK_LAYOUT_H_
#define RL_TRAINER_RANK_LAYOUT_H_

#include <c10/core/Device.h>

#include <string>
#include <vector>

#include "launch/mpi_session.h"

namespace rl {

struct RankInfo {
  int rank = 0;
  int local_rank = 0;
  std::string host;
  std::string device;  // "cpu" or "cuda:0"
};

// Collective over the session's ranks; every rank gets the whole layout, ordered by rank.
std::vector<RankInfo> GatherRankLayout(const MpiSession& session, c10::Device device);

// One line per rank: "rank 0  local 0  host-a  cuda:0".
std::string FormatRankLayout(const std::vector<RankInfo>& layout);

}  // namespace rl

#endif  // RL_TRAINER_RANK_LAYOUT_H_
