// The contract between a fuzz target and what runs it.
//
// Each fuzz/<name>_fuzz.cc defines LLVMFuzzerTestOneInput for one parser of untrusted input; the
// input is the bytes of one file (each target's comment says which). A target catches rl::Error
// (launch/check.h), the parsers' documented way of refusing input, and nothing else. Anything that
// leaves LLVMFuzzerTestOneInput is a finding: another exception (std::out_of_range,
// std::bad_alloc, a FuzzFinding for a broken invariant of the parsed result), and so are a crash,
// a sanitizer report and a hang.
//
// Two things run the targets: libFuzzer, when fuzz/run.sh builds them with clang and
// -fsanitize=fuzzer,address,undefined, and corpus_main.cc, which replays the saved corpora
// (fuzz/corpus/<name>/) as `bazel test //fuzz:<name>_corpus_test`, built with gcc.
//
// Thread safety: targets keep no state between inputs.
#ifndef RL_FUZZ_FUZZ_TARGET_H_
#define RL_FUZZ_FUZZ_TARGET_H_

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace rl::fuzz {

// A parser accepted an input but its result breaks a documented property. Deliberately not an
// rl::Error, so that no target swallows it.
class FuzzFinding : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace rl::fuzz

// Throws FuzzFinding with a formatted message when `cond` is false.
#define RL_FUZZ_EXPECT(cond, ...)                                                               \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      throw ::rl::fuzz::FuzzFinding(::fmt::format("{}:{}: `{}` failed: {}", __FILE__, __LINE__, \
                                                  #cond, ::fmt::format(__VA_ARGS__)));          \
    }                                                                                           \
  } while (0)

#endif  // RL_FUZZ_FUZZ_TARGET_H_
