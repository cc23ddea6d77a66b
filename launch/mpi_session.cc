#include "launch/mpi_session.h"

#include <cstdlib>

#include "launch/check.h"

namespace rl {

MpiSession::MpiSession(int* argc, char*** argv) {
  int provided = 0;
  RL_CHECK_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  RL_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
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
