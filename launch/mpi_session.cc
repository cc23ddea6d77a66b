#include "launch/mpi_session.h"

#include <cstdlib>

#include "launch/check.h"

namespace rl {

MpiSession::MpiSession(int* argc, char*** argv) {
  // Serialized, not funneled: on a GPU the autograd engine runs backward nodes on its own device
  // thread, so the expert exchange's backward (Note [Expert-parallel MoE]) polls NCCL and serves
  // the peer probe's MPI messages from that thread, while the main thread waits in backward().
  int provided = 0;
  RL_CHECK_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided));
  RL_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  RL_CHECK(provided >= MPI_THREAD_SERIALIZED, Error,
           "MPI provides thread level {}, below MPI_THREAD_SERIALIZED ({}): the GPU backward "
           "calls MPI from the autograd engine's thread; use an MPI built with thread support",
           provided, MPI_THREAD_SERIALIZED);
  RL_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  RL_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world_size_));

  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int name_length = 0;
  RL_CHECK_MPI(MPI_Get_processor_name(name, &name_length));
  host_.assign(name, name_length);
  SetProcessIdentity({rank_, host_});

  MPI_Comm node_comm = MPI_COMM_NULL;
  RL_CHECK_MPI(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_comm));
  RL_CHECK_MPI(MPI_Comm_rank(node_comm, &local_rank_));
  RL_CHECK_MPI(MPI_Comm_size(node_comm, &local_size_));
  RL_CHECK_MPI(MPI_Comm_free(&node_comm));
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    MPI_Finalize();
  }
}

void MpiSession::AbortJob(int exit_code) const {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this keeps [[noreturn]] honest.
}

}  // namespace rl
