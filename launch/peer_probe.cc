#include "launch/peer_probe.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string_view>
#include <thread>

#include "launch/check.h"

namespace rl {
namespace {

constexpr int kAskTag = 1;
constexpr int kAnswerTag = 2;
constexpr int64_t kNoAnswer = -1;

using Clock = std::chrono::steady_clock;

void CheckMpi(int status, const char* what) {
  RL_CHECK(status == MPI_SUCCESS, CommError, "peer probe: {} failed (MPI error {})", what, status);
}

// "rank 1", "world ranks 1, 3".
std::string RankList(std::string_view rank_word, const std::vector<int>& ranks) {
  return fmt::format("{}{} {}", rank_word, ranks.size() == 1 ? "" : "s", fmt::join(ranks, ", "));
}

}  // namespace

std::chrono::milliseconds ProbePatience(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 4, std::chrono::milliseconds(100), std::chrono::milliseconds(1000));
}

PeerProbe::PeerProbe(MPI_Comm world) {
  CheckMpi(MPI_Comm_dup(world, &comm_), "MPI_Comm_dup");
  CheckMpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  CheckMpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  CheckMpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

PeerProbe::~PeerProbe() {
  bool all_sent = true;
  for (MPI_Request& request : sends_) {
    int done = 0;
    if (request != MPI_REQUEST_NULL && MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS &&
        !done) {
      MPI_Request_free(&request);
      all_sent = false;
    }
  }
  if (!all_sent) {
    // MPI may still read them: leak rather than free memory a pending send uses.
    new std::vector<std::unique_ptr<Position>>(std::move(send_buffers_));
  }
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void PeerProbe::Service() {
  while (true) {
    int arrived = 0;
    MPI_Status status;
    CheckMpi(MPI_Iprobe(MPI_ANY_SOURCE, kAskTag, comm_, &arrived, &status), "MPI_Iprobe");
    if (!arrived) return;
    Position ignored{};
    CheckMpi(MPI_Recv(ignored.data(), 2, MPI_INT64_T, status.MPI_SOURCE, kAskTag, comm_,
                      MPI_STATUS_IGNORE),
             "MPI_Recv");
    send_buffers_.push_back(std::make_unique<Position>(position_));
    sends_.emplace_back(MPI_REQUEST_NULL);
    CheckMpi(MPI_Isend(send_buffers_.back()->data(), 2, MPI_INT64_T, status.MPI_SOURCE, kAnswerTag,
                       comm_, &sends_.back()),
             "MPI_Isend");
  }
}

std::string PeerProbe::Diagnose(const std::vector<int>& members,
                                std::chrono::milliseconds patience) {
  std::vector<Position> answers(members.size(), Position{kNoAnswer, kNoAnswer});
  std::vector<MPI_Request> receives(members.size(), MPI_REQUEST_NULL);
  for (size_t i = 0; i < members.size(); ++i) {
    const int peer = members[i];
    if (peer == rank_) continue;
    CheckMpi(MPI_Irecv(answers[i].data(), 2, MPI_INT64_T, peer, kAnswerTag, comm_, &receives[i]),
             "MPI_Irecv");
    send_buffers_.push_back(std::make_unique<Position>(position_));
    sends_.emplace_back(MPI_REQUEST_NULL);
    CheckMpi(MPI_Isend(send_buffers_.back()->data(), 2, MPI_INT64_T, peer, kAskTag, comm_,
                       &sends_.back()),
             "MPI_Isend");
  }
  const auto deadline = Clock::now() + patience;
  bool all_answered = false;
  while (!all_answered && Clock::now() < deadline) {
    Service();  // a peer that timed out too asks this rank at the same time
    int done = 0;
    CheckMpi(
        MPI_Testall(static_cast<int>(receives.size()), receives.data(), &done, MPI_STATUSES_IGNORE),
        "MPI_Testall");
    all_answered = done != 0;
    if (!all_answered) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // In the world's own group a rank is a world rank; elsewhere say which numbering it is.
  const bool whole_world =
      static_cast<int>(members.size()) == size_ && std::is_sorted(members.begin(), members.end());
  const char* rank_word = whole_world ? "rank" : "world rank";
  std::vector<int> silent;
  std::vector<std::string> elsewhere;
  for (size_t i = 0; i < members.size(); ++i) {
    if (receives[i] != MPI_REQUEST_NULL) {
      // Not answered: cancel the receive so MPI forgets the buffer.
      MPI_Cancel(&receives[i]);
      MPI_Wait(&receives[i], MPI_STATUS_IGNORE);
    }
    const int peer = members[i];
    const Position& answer = answers[i];
    if (peer == rank_) continue;
    if (answer[0] == kNoAnswer) {
      silent.push_back(peer);
    } else if (answer[0] != position_[0]) {
      elsewhere.push_back(
          fmt::format("{} {} is in collective #{} of another group", rank_word, peer, answer[1]));
    } else if (answer[1] != position_[1]) {
      elsewhere.push_back(fmt::format("{} {} is in collective #{}", rank_word, peer, answer[1]));
    }
  }
  std::vector<std::string> parts;
  if (!silent.empty()) {
    parts.push_back(
        fmt::format("waiting for {} (no answer to a probe within {} ms: hung, dead or outside the "
                    "collectives)",
                    RankList(rank_word, silent), patience.count()));
  }
  if (!elsewhere.empty()) {
    parts.push_back(fmt::format("{}, this rank in #{}", fmt::join(elsewhere, "; "), position_[1]));
  }
  if (parts.empty()) {
    parts.push_back(
        fmt::format("every peer answered from this collective (#{}): it is stuck in "
                    "the transport, not waiting for a rank",
                    position_[1]));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace rl
