// Which peer a timed-out collective waited for (Note [Peer probe]).
//
// Note [Peer probe]
// A collective that times out knows that some rank did not join, not which. Each communicator
// therefore counts the collectives it enters (Enter()) and, while it waits in one, answers probes
// from its peers (Service(), one MPI_Iprobe per call). When a wait times out the rank asks every
// peer for its count (Diagnose()) and waits a short while for the answers: a peer that does not
// answer is not in any collective (hung in a kernel, dead, or busy elsewhere); a peer that answers
// with another count is in a different collective. Probes travel on a duplicate of the world
// communicator of their own, so they never match a collective's messages.
//
// Ownership: owns its duplicated communicator. Probe requests and buffers still pending when the
// job ends are released without waiting (the job is ending). Not thread-safe: called from the
// thread that issues the collectives.
// Failures: MPI errors throw CommError.
#ifndef RL_LAUNCH_PEER_PROBE_H_
#define RL_LAUNCH_PEER_PROBE_H_

#include <mpi.h>

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

  // This rank enters its next collective.
  void Enter() { ++sequence_; }
  int64_t sequence() const { return sequence_; }
  // Answers the probes that have arrived; cheap when none have.
  void Service();
  // Asks every peer where it is and waits up to `patience` for the answers. Returns e.g.
  // "waiting for rank 1 (no answer to a probe within 1000 ms: hung, dead or outside the
  // collectives)" or "rank 2 is in collective #7, this rank in #6".
  std::string Diagnose(std::chrono::milliseconds patience);

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int64_t sequence_ = 0;
  // Sends that may still be in flight and the buffers they read from.
  std::vector<MPI_Request> sends_;
  std::vector<std::unique_ptr<int64_t>> send_buffers_;
};

// The probe patience for a collective timeout: a quarter of it, between 100 ms and 1 s.
std::chrono::milliseconds ProbePatience(std::chrono::milliseconds timeout);

}  // namespace rl

#endif  // RL_LAUNCH_PEER_PROBE_H_
