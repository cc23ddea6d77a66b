// Injected faults for the failure-handling tests (Note [Fault injection]).
//
// Note [Fault injection]
// RL_FAULT="KIND:RANK:ITERATION" makes rank RANK fail in iteration ITERATION (1-based):
//   hang        stops responding at the start of the train phase (a stuck kernel or a frozen
//               host, as its peers see it): sleeps forever;
//   kill        dies at the start of the train phase: SIGKILL to itself (a lost host, the OOM
//               killer);
//   save_crash  dies in the middle of that iteration's checkpoint write, once its own files
//               are on disk (rank 0: every file but the manifest; others: their optimizer
//               shard) and before the checkpoint is committed: _exit(3), no clean-up;
//   exchange_hang  stops responding in the first expert-parallel row exchange of that
//               iteration (Note [Expert-parallel MoE]), after the per-expert counts went out, so
//               that its EP group's peers wait inside the rows' all-to-all: sleeps forever.
// Tests use it to check that the other ranks end the job within the communicator timeout, and
// that a checkpoint cut short is never loaded. Unset, it costs one getenv per call.
// Failures: a malformed RL_FAULT throws rl::ConfigError naming the variable and the format.
#ifndef RL_TRAINER_FAULT_INJECTION_H_
#define RL_TRAINER_FAULT_INJECTION_H_

#include <cstdint>

namespace rl {

enum class FaultPoint { kTrain, kCheckpointWrite, kExpertExchange };

// Fails here when RL_FAULT names this point's kind, this rank and this iteration.
void MaybeInjectFault(FaultPoint point, int rank, int64_t iteration);

// For fault points deep in the model, which know neither: the (world) rank and the iteration
// (1-based) that MaybeInjectFault(point) uses, set by the colocated loop at the start of each
// iteration. Before the first call, MaybeInjectFault(point) does nothing.
void SetFaultContext(int rank, int64_t iteration);
void MaybeInjectFault(FaultPoint point);

}  // namespace rl

#endif  // RL_TRAINER_FAULT_INJECTION_H_
