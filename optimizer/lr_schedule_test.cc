// Learning-rate schedules at hand-computed points.
#include "optimizer/lr_schedule.h"

#include <catch2/catch.hpp>

#include <iterator>
#include <string>

namespace rl::optimizer {
namespace {

TEST_CASE("linear warm-up from 0, then constant") {
  LrSchedule s{1e-3, 0.0, LrDecayStyle::kConstant, 4, 0};
  CHECK(s.At(1) == Approx(2.5e-4));
  CHECK(s.At(4) == Approx(1e-3));
  CHECK(s.At(100) == 1e-3);
}

TEST_CASE("linear and cosine decay reach min_lr at the end of decay and stay there") {
  LrSchedule linear{1.0, 0.1, LrDecayStyle::kLinear, 0, 10};
  CHECK(linear.At(5) == Approx(0.55));  // 0.1 + 0.9 * (1 - 5/10)
  CHECK(linear.At(10) == Approx(0.1));
  CHECK(linear.At(20) == Approx(0.1));
  LrSchedule cosine{1.0, 0.0, LrDecayStyle::kCosine, 2, 4};
  CHECK(cosine.At(2) == Approx(1.0));   // end of warm-up
  CHECK(cosine.At(4) == Approx(0.5));   // half-way: 0.5 * (1 + cos(pi/2))
  CHECK(cosine.At(6) == Approx(0.0).margin(1e-12));
}

// Unknown names are refused by the config parser that reads this table (trainer/config).
TEST_CASE("the name table spells each decay style once, as --lr-decay-style takes it") {
  const auto& names = EnumNames(LrDecayStyle::kConstant);
  REQUIRE(std::size(names) == 3);
  CHECK((names[0].first == LrDecayStyle::kConstant && names[0].second == std::string("constant")));
  CHECK((names[1].first == LrDecayStyle::kLinear && names[1].second == std::string("linear")));
  CHECK((names[2].first == LrDecayStyle::kCosine && names[2].second == std::string("cosine")));
}

}  // namespace
}  // namespace rl::optimizer
