#include "launch/peer_probe.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
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

std::string RankList(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
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
    new std::vector<std::unique_ptr<int64_t>>(std::move(send_buffers_));
  }
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void PeerProbe::Service() {
  while (true) {
    int arrived = 0;
    MPI_Status status;
    CheckMpi(MPI_Iprobe(MPI_ANY_SOURCE, kAskTag, comm_, &arrived, &status), "MPI_Iprobe");
    if (!arrived) return;
    int64_t ignored = 0;
    CheckMpi(MPI_Recv(&ignored, 1, MPI_INT64_T, status.MPI_SOURCE, kAskTag, comm_,
                      MPI_STATUS_IGNORE),
             "MPI_Recv");
    send_buffers_.push_back(std::make_unique<int64_t>(sequence_));
    sends_.emplace_back(MPI_REQUEST_NULL);
    CheckMpi(MPI_Isend(send_buffers_.back().get(), 1, MPI_INT64_T, status.MPI_SOURCE, kAnswerTag,
                       comm_, &sends_.back()),
             "MPI_Isend");
  }
}

std::string PeerProbe::Diagnose(std::chrono::milliseconds patience) {
  std::vector<int64_t> answers(static_cast<size_t>(size_), kNoAnswer);
  std::vector<MPI_Request> receives(static_cast<size_t>(size_), MPI_REQUEST_NULL);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    CheckMpi(MPI_Irecv(&answers[static_cast<size_t>(peer)], 1, MPI_INT64_T, peer, kAnswerTag,
                       comm_, &receives[static_cast<size_t>(peer)]),
             "MPI_Irecv");
    send_buffers_.push_back(std::make_unique<int64_t>(sequence_));
    sends_.emplace_back(MPI_REQUEST_NULL);
    CheckMpi(MPI_Isend(send_buffers_.back().get(), 1, MPI_INT64_T, peer, kAskTag, comm_,
                       &sends_.back()),
             "MPI_Isend");
  }
  const auto deadline = Clock::now() + patience;
  bool all_answered = false;
  while (!all_answered && Clock::now() < deadline) {
    Service();  // a peer that timed out too asks this rank at the same time
    int done = 0;
    CheckMpi(MPI_Testall(size_, receives.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    all_answered = done != 0;
    if (!all_answered) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<int> silent;
  std::vector<std::string> elsewhere;
  for (int peer = 0; peer < size_; ++peer) {
    MPI_Request& request = receives[static_cast<size_t>(peer)];
    if (request != MPI_REQUEST_NULL) {
      // Not answered: cancel the receive so MPI forgets the buffer.
      MPI_Cancel(&request);
      MPI_Wait(&request, MPI_STATUS_IGNORE);
    }
    const int64_t answer = answers[static_cast<size_t>(peer)];
    if (peer == rank_) continue;
    if (answer == kNoAnswer) {
      silent.push_back(peer);
    } else if (answer != sequence_) {
      elsewhere.push_back(fmt::format("rank {} is in collective #{}", peer, answer));
    }
  }
  std::vector<std::string> parts;
  if (!silent.empty()) {
    parts.push_back(fmt::format(
        "waiting for {} (no answer to a probe within {} ms: hung, dead or outside the "
        "collectives)",
        RankList(silent), patience.count()));
  }
  if (!elsewhere.empty()) {
    parts.push_back(fmt::format("{}, this rank in #{}", fmt::join(elsewhere, "; "), sequence_));
  }
  if (parts.empty()) {
    parts.push_back(fmt::format("every peer answered from this collective (#{}): it is stuck in "
                                "the transport, not waiting for a rank",
                                sequence_));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace rl
