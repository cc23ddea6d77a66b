// PromptShare divides a batch of prompts among data-parallel ranks into contiguous ranges that
// cover it exactly once and differ in size by at most one.
#include "trainer/rollout_split.h"

#include <catch2/catch.hpp>

namespace rl {
namespace {

TEST_CASE("prompt shares are contiguous, cover the batch and differ by at most one",
          "[rollout_split]") {
  for (int64_t prompts = 0; prompts <= 17; ++prompts) {
    for (int size = 1; size <= 5; ++size) {
      INFO(prompts << " prompts over " << size << " ranks");
      int64_t next = 0;
      for (int rank = 0; rank < size; ++rank) {
        const PromptRange r = PromptShare(prompts, rank, size);
        CHECK(r.begin == next);
        CHECK((r.size() == prompts / size || r.size() == prompts / size + 1));
        // Larger shares come first, so rank 0's is the largest (the engine sizes by it).
        CHECK(r.size() <= PromptShare(prompts, 0, size).size());
        next = r.end;
      }
      CHECK(next == prompts);
    }
  }
}

}  // namespace
}  // namespace rl
