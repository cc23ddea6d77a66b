#include "trainer/model/moe_reference.h"

namespace rl::model {

at::Tensor MoeBlockByExpertLoop(const MoeWeights& w, const ModelConfig& c, const at::Tensor& x) {
  const int64_t hidden = x.size(-1);
  const at::Tensor x2 = x.reshape({-1, hidden});
  const int64_t tokens = x2.size(0);
  const Routing r = Route(w, c, x2);
  const int64_t k = r.indices.size(1);
  const int64_t inter = w.down.size(2);
  const at::Tensor pairs = x2.unsqueeze(1).expand({tokens, k, hidden}).reshape({-1, hidden});
  const at::Tensor flat = r.indices.reshape({-1}).cpu();
  at::Tensor ys = at::zeros({tokens * k, hidden}, x.options());
  for (int64_t e = 0; e < w.gate_up.size(0); ++e) {
    const at::Tensor rows = at::nonzero(flat == e).view({-1}).to(x.device());
    if (rows.numel() == 0) continue;
    const at::Tensor gate_up = Linear(pairs.index_select(0, rows), w.gate_up[e]);
    const at::Tensor act = at::silu(gate_up.narrow(1, 0, inter)) * gate_up.narrow(1, inter, inter);
    ys = ys.index_copy(0, rows, Linear(act, w.down[e]));
  }
  at::Tensor out =
      (ys.view({tokens, k, hidden}) * r.weights.unsqueeze(-1)).sum(1).to(x.scalar_type());
  if (w.has_shared) out = out + DenseMlp(w.shared, x2);
  return out.view(x.sizes());
}

}  // namespace rl::model
