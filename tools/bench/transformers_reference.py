"""The PyTorch side of tools/bench/vs_transformers.sh: `transformers`' own implementation of a
checkpoint, timed on the same batch shapes as our benchmarks.

  make    --out DIR [--shape S]     writes a randomly initialised checkpoint (bf16, untied lm_head,
                                    torch.manual_seed(0)) with save_pretrained; --shape
                                    qwen3_0.6b (default): Qwen3-0.6B-shaped; qwen3_moe_4layer:
                                    Qwen3-30B-A3B-shaped (128 experts, top-8) cut to 4 layers;
                                    glm47_flash_4layer: GLM-4.7-Flash (MLA + MoE, 64 experts,
                                    top-4) cut to 4 layers
  decode  --checkpoint DIR ...      greedy `generate` (min_new_tokens = max_new_tokens), tokens/s
  train   --checkpoint DIR ...      one step: forward, -mean log-prob of the next tokens,
                                    backward, torch.optim.AdamW (bf16 params, the default
                                    foreach implementation), tokens/s

Each of decode/train prints one JSON line. On an MoE checkpoint they load the model with
experts_implementation="grouped_mm" (transformers 5's grouped-GEMM experts) where
from_pretrained takes it, else with the default, and say which in the line ("experts"). The
prompts and training tokens are drawn like the C++ benchmarks draw theirs (uniform ids, seed 7), on the GPU, best of --rounds.
"""
import argparse
import json
import os
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def model_for(shape):
    """The config of a `make --shape`."""
    if shape == "qwen3_0.6b":
        from transformers import Qwen3Config

        return Qwen3Config(
            vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128,
            max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
            tie_word_embeddings=False, torch_dtype="bfloat16")
    if shape == "glm47_flash_4layer":
        # GLM-4.7-Flash (MLA, sigmoid noaux_tc router, 64 experts top-4, a shared expert) at its
        # widths, 4 layers of its 47: layer 0 dense, 1-3 MoE.
        from transformers import AutoConfig

        fields = json.load(open(os.path.join(HERE, "../../configs/models/glm47_flash.json")))
        fields["num_hidden_layers"] = 4
        return AutoConfig.for_model(fields.pop("model_type"), **fields)
    from transformers import Qwen3MoeConfig

    # Qwen3-30B-A3B's shape, 4 layers of its 48, every one MoE.
    return Qwen3MoeConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=4,
        head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, torch_dtype="bfloat16")


def make(args):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = model_for(args.shape)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # GPU init: seconds
        model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(args.out, safe_serialization=True)
    print(json.dumps({"made": args.out, "shape": args.shape,
                      "params": sum(p.numel() for p in model.parameters())}))


def load(args):
    """The model in bf16 on the GPU, and for an MoE model the experts implementation used."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = dict(torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    experts = None
    config = AutoConfig.from_pretrained(args.checkpoint)
    if getattr(config, "num_experts", None) or getattr(config, "n_routed_experts", None):
        try:
            model = AutoModelForCausalLM.from_pretrained(
                args.checkpoint, experts_implementation="grouped_mm", **kwargs)
            experts = getattr(model.config, "_experts_implementation", None) or "grouped_mm"
        except (TypeError, ValueError) as e:  # an older transformers, or not this model
            model = AutoModelForCausalLM.from_pretrained(args.checkpoint, **kwargs)
            experts = f"default ({type(e).__name__}: {str(e)[:120]})"
    else:
        model = AutoModelForCausalLM.from_pretrained(args.checkpoint, **kwargs)
    return model.cuda(), experts


def labels(experts):
    return {} if experts is None else {"experts": experts}


def best_seconds(fn, rounds):
    fn()  # warm-up
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def decode(args):
    model, experts = load(args)
    model.eval()
    vocab = model.config.vocab_size
    ids = torch.randint(vocab, (args.batch, args.prompt_len),
                        generator=torch.Generator().manual_seed(7)).cuda()
    mask = torch.ones_like(ids)

    @torch.no_grad()
    def run():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                             max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                             pad_token_id=0)
        assert out.shape[1] == args.prompt_len + args.new_tokens

    seconds = best_seconds(run, args.rounds)
    print(json.dumps({"bench": "decode", "reference": "transformers generate",
                      "batch": args.batch, "prompt_len": args.prompt_len,
                      "new_tokens": args.new_tokens, "seconds": seconds,
                      "tokens_per_s": args.batch * args.new_tokens / seconds,
                      **labels(experts)}))


def train(args):
    model, experts = load(args)
    model.train()
    vocab = model.config.vocab_size
    tokens = torch.randint(vocab, (args.batch, args.seq + 1),
                           generator=torch.Generator().manual_seed(7)).cuda()
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)

    def forward():
        logits = model(input_ids=inputs).logits
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        return -log_probs.gather(-1, targets.unsqueeze(-1)).mean()

    def update():
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def steps():
        for _ in range(args.steps):
            forward().backward()
            update()

    seconds = best_seconds(steps, args.rounds) / args.steps
    # The same step timed phase by phase, a device sync around each (as train_step_bench does).
    phase_ms = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    for _ in range(args.steps):
        for phase, fn in (("forward", forward), ("backward", None), ("optimizer", update)):
            torch.cuda.synchronize()
            start = time.perf_counter()
            if phase == "forward":
                loss = fn()
            elif phase == "backward":
                loss.backward()
            else:
                fn()
            torch.cuda.synchronize()
            phase_ms[phase] += 1e3 * (time.perf_counter() - start) / args.steps
    print(json.dumps({"bench": "train_step", "reference": "transformers + torch.optim.AdamW",
                      "batch": args.batch, "seq": args.seq, "seconds": seconds,
                      "tokens_per_s": args.batch * args.seq / seconds,
                      **{f"{k}_ms": v for k, v in phase_ms.items()}, **labels(experts)}))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["make", "decode", "train"])
    parser.add_argument("--out")
    parser.add_argument("--shape", choices=["qwen3_0.6b", "qwen3_moe_4layer", "glm47_flash_4layer"],
                        default="qwen3_0.6b", help="make: the model's shape")
    parser.add_argument("--checkpoint")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    {"make": make, "decode": decode, "train": train}[args.mode](args)


if __name__ == "__main__":
    main()
