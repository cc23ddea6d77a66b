// Fuzz target: the config-file reader (trainer/config/toml.h) and the config stage behind it.
//
// Input: the text of a --config TOML file. It is parsed and applied to the default Config
// (ApplyToml), which is then validated; both refuse bad input with ConfigError. A config that
// applies must survive what a checkpoint does with it: DumpToml, then ParseToml and ApplyToml of
// that text, must give the same dump back (config.h promises "Parsing it back gives the same
// Config").
#include <string>
#include <string_view>

#include "fuzz/fuzz_target.h"
#include "launch/check.h"
#include "trainer/config/config.h"
#include "trainer/config/toml.h"
#include "trainer/config/validate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using rl::config::ApplyToml;
  using rl::config::Config;
  using rl::config::DumpToml;
  using rl::config::ParseToml;
  using rl::config::Validate;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Config config;
  try {
    ApplyToml(ParseToml(text, "fuzz.toml"), config);
  } catch (const rl::Error&) {
    return 0;
  }
  Validate(config);  // reports broken rules in its result, never by throwing

  const std::string dumped = DumpToml(config);
  Config read_back;
  try {
    ApplyToml(ParseToml(dumped, "dumped.toml"), read_back);
  } catch (const rl::Error& e) {
    RL_FUZZ_EXPECT(false, "the dumped config does not read back: {}\n{}", e.what(), dumped);
  }
  const std::string dumped_again = DumpToml(read_back);
  RL_FUZZ_EXPECT(dumped_again == dumped, "the config changed on a round trip:\n{}\nbecame\n{}",
                 dumped, dumped_again);
  return 0;
}
