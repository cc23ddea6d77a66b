// Fuzz target: the safetensors header reader (trainer/model/safetensors.h).
//
// Input: the bytes of a whole .safetensors file. ParseSafetensorsHeader (SafetensorsFile::Open
// without the mapping) refuses bad files with CheckpointError. For a file it accepts, the
// properties SafetensorsFile::Get() relies on must hold (Note [Safetensors layout]): every
// tensor's bytes lie inside the data section and are exactly its shape times its element size,
// and the tensors tile the data section.
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_target.h"
#include "launch/check.h"
#include "trainer/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using rl::model::ParseSafetensorsHeader;
  using rl::model::SafetensorsHeader;
  using rl::model::TensorInfo;
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  SafetensorsHeader header;
  try {
    header = ParseSafetensorsHeader("fuzz.safetensors", file);
  } catch (const rl::Error&) {
    return 0;
  }
  RL_FUZZ_EXPECT(header.header_bytes >= 0 && static_cast<uint64_t>(header.header_bytes) <= size - 8,
                 "header length {} in a {}-byte file", header.header_bytes, size);
  const int64_t data_bytes = static_cast<int64_t>(size) - 8 - header.header_bytes;
  int64_t covered = 0;
  for (const TensorInfo& t : header.tensors) {
    RL_FUZZ_EXPECT(0 <= t.data_begin && t.data_begin <= t.data_end && t.data_end <= data_bytes,
                   "tensor '{}': [{}, {}) outside the {}-byte data section", t.name, t.data_begin,
                   t.data_end, data_bytes);
    int64_t numel = 1;
    for (const int64_t dim : t.shape) numel *= dim;  // checked against overflow by the parser
    RL_FUZZ_EXPECT(t.num_bytes() == numel * static_cast<int64_t>(c10::elementSize(t.dtype)),
                   "tensor '{}': {} bytes for {} elements of {}", t.name, t.num_bytes(), numel,
                   t.dtype_name);
    covered += t.num_bytes();
  }
  RL_FUZZ_EXPECT(covered == data_bytes, "tensors hold {} bytes of a {}-byte data section", covered,
                 data_bytes);
  return 0;
}
