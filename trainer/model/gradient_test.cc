// Autograd through the decoder against central finite differences, in fp64, on every fixture
// (so each part is covered: GQA with partial RoPE and qkv bias, MLA with YaRN, softmax and
// group-limited sigmoid routing with shared experts, DSA masking with shared indexer layers).
//
// For each parameter p and a random direction u: analytic <dL/dp, u> vs
// (L(p + eps u) - L(p - eps u)) / (2 eps), eps = 1e-6, L = sum(logits * R) for a fixed random R.
// Tolerance: |analytic - numeric| <= 1e-6 * max(1, |analytic|). Routing and DSA top-k choices do not
// flip under the perturbation: the fixtures were generated with top-k margins >= 1e-3
// (tests/fixtures/README.md), far above the ~1e-6 change of any score.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <catch2/catch.hpp>

#include "trainer/model/decoder.h"
#include "trainer/model/test_fixtures.h"

namespace rl::model {
namespace {

bool IsIndexerParam(const std::string& name) { return name.find(".indexer.") != std::string::npos; }

TEST_CASE("Gradients match finite differences; the indexer and the router bias get none") {
  at::manual_seed(7);
  for (const std::string& name : testing::FixtureNames()) {
    INFO("fixture " << name);
    testing::LoadedModel m = testing::LoadFixture(name, at::kDouble);
    for (auto& [param, t] : m.params) t.set_requires_grad(true);
    Decoder model(m.config, m.params);
    // The long tokens, so that the DSA fixtures select a strict subset of keys.
    const at::Tensor tokens =
        testing::ReferenceTensor(name, "reference.safetensors", "tokens_long");
    const at::Tensor r = at::randn({tokens.size(0), tokens.size(1), m.config.vocab_size},
                                   at::kDouble);
    auto loss = [&] { return (model.Logits(tokens) * r).sum(); };
    loss().backward();

    // One check per parameter, except that the routed experts of a layer move together (one
    // direction over all of them) to keep the number of forwards small.
    std::vector<std::pair<std::string, std::vector<std::string>>> groups;
    for (const ParamSpec& spec : ListParams(m.config)) {
      const at::Tensor& p = m.params.at(spec.name);
      if (IsIndexerParam(spec.name) || spec.role == ParamRole::kFp32Extra) {
        INFO(spec.name);
        CHECK_FALSE(p.grad().defined());
        continue;
      }
      if (spec.role != ParamRole::kRoutedExpert) {
        INFO(spec.name);
        CHECK(p.grad().defined());
        groups.push_back({spec.name, {spec.name}});
        continue;
      }
      const std::string group = spec.name.substr(0, spec.name.find(".experts.") + 9) + "*";
      if (groups.empty() || groups.back().first != group) groups.push_back({group, {}});
      groups.back().second.push_back(spec.name);
    }
    double worst = 0;
    std::string worst_name;
    for (const auto& [group, members] : groups) {
      INFO(group);
      double analytic = 0;
      std::vector<at::Tensor> directions, saved;
      for (const std::string& member : members) {
        const at::Tensor& p = m.params.at(member);
        directions.push_back(at::randn_like(p));
        saved.push_back(p.detach().clone());
        // An expert no token routes to gets no gradient (and the loss does not depend on it).
        if (p.grad().defined()) analytic += (p.grad() * directions.back()).sum().item<double>();
      }
      const double eps = 1e-6;
      auto shifted_loss = [&](double step) {
        at::NoGradGuard no_grad;
        for (size_t i = 0; i < members.size(); ++i) {
          m.params.at(members[i]).detach().copy_(saved[i]).add_(directions[i], step);
        }
        const double value = loss().item<double>();
        for (size_t i = 0; i < members.size(); ++i) m.params.at(members[i]).detach().copy_(saved[i]);
        return value;
      };
      const double numeric = (shifted_loss(eps) - shifted_loss(-eps)) / (2 * eps);
      const double err = std::abs(analytic - numeric) / std::max(1.0, std::abs(analytic));
      if (err > worst) {
        worst = err;
        worst_name = group;
      }
      CHECK(err <= 1e-6);
    }
    fmt::print("{:20s} worst relative gradient error {:.3g} ({})\n", name, worst, worst_name);
  }
}

}  // namespace
}  // namespace rl::model
