// The MPI session: owns MPI_Init/MPI_Finalize and knows who this rank is.
//
// One per process, created first in main(). It sets the process identity used by error
// messages (launch/check.h) and makes MPI_COMM_WORLD return error codes instead of aborting, so
// that every MPI call can be checked and reported with RL_CHECK_MPI.
//
// local_rank is the rank among the processes on the same host (MPI_COMM_TYPE_SHARED); it picks
// the GPU. Not thread-safe; MPI is initialised with MPI_THREAD_SERIALIZED: one thread at a time
// calls MPI (the main thread, or on a GPU the autograd engine's thread running a backward node
// while the main thread waits in backward()).
#ifndef RL_LAUNCH_MPI_SESSION_H_
#define RL_LAUNCH_MPI_SESSION_H_

#include <mpi.h>

#include <string>

namespace rl {

class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();  // MPI_Finalize; never throws.
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  const std::string& host() const { return host_; }
  MPI_Comm world() const { return MPI_COMM_WORLD; }

  // Ends every rank of the job with `exit_code` (MPI_Abort). Used when this rank cannot go on
  // and the others might otherwise wait for it.
  [[noreturn]] void AbortJob(int exit_code) const;

 private:
  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  std::string host_;
};

}  // namespace rl

#endif  // RL_LAUNCH_MPI_SESSION_H_
