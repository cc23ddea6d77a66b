// Which peer a timed-out collective waited for (Note [Peer probe]).
//
// Note [Peer probe]
// A collective that times out knows that some rank did not join, not which. Each communicator
// therefore counts the collectives it enters and tells the probe where this rank is (Enter(): the
// group's tag and the collective's ordinal in that group), and, while it waits, answers probes
// from its peers (Service(), one MPI_Iprobe per call). When a wait times out the rank asks every
// other member of the group for its position (Diagnose()) and waits a short while for the
// answers: a member that does not answer is not in any collective (hung in a kernel, dead, busy
// elsewhere, or already given up on this one after its own timeout); one that answers with
// another ordinal, or from another group, is in a different collective. Probes travel on a
// duplicate of the world communicator of their own, so they never match a collective's messages,
// and peers are named by world rank.
//
// One probe serves a communicator and every communicator split from it (Note [Sub-groups] in
// launch/communicator.h): it is created once, collectively over the world, and shared, so a
// Split, which is collective only over its parent, needs no world-wide call.
//
// Ownership: owns its duplicated communicator; communicators share it (std::shared_ptr). Probe
// requests and buffers still pending when the job ends are released without waiting (the job is
// ending). Not thread-safe: called from the thread that issues the collectives.
// Failures: MPI errors throw CommError.
#ifndef RL_LAUNCH_PEER_PROBE_H_
#define RL_LAUNCH_PEER_PROBE_H_

#include <mpi.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rl {

class PeerProbe {
 public:
  // Collective over `world` (duplicates it).
  explicit PeerProbe(MPI_Comm world);
  ~PeerProbe();
  PeerProbe(const PeerProbe&) = delete;
  PeerProbe& operator=(const PeerProbe&) = delete;

  // This rank enters collective #`sequence` of the group tagged `group_tag` (equal on the
  // group's members, different between groups).
  void Enter(int64_t group_tag, int64_t sequence) { position_ = {group_tag, sequence}; }
  // Answers the probes that have arrived; cheap when none have.
  void Service();
  // Asks the other `members` (world ranks of the group this rank waits in, this rank included)
  // where they are and waits up to `patience` for the answers. Returns e.g. "waiting for rank 1
  // (no answer to a probe within 1000 ms: hung, dead or outside the collectives)" or "rank 2 is
  // in collective #7, this rank in #6". Ranks are world ranks; the text says "world rank" unless
  // the group is the world in world order.
  std::string Diagnose(const std::vector<int>& members, std::chrono::milliseconds patience);

 private:
  // What a probe answers: {group tag, ordinal of the collective in that group}.
  using Position = std::array<int64_t, 2>;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  Position position_ = {0, 0};
  // Sends that may still be in flight and the buffers they read from.
  std::vector<MPI_Request> sends_;
  std::vector<std::unique_ptr<Position>> send_buffers_;
};

// The probe patience for a collective timeout: a quarter of it, between 100 ms and 1 s.
std::chrono::milliseconds ProbePatience(std::chrono::milliseconds timeout);

}  // namespace rl

#endif  // RL_LAUNCH_PEER_PROBE_H_
