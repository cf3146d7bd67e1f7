#!/usr/bin/python3
"""Writes the Mixture-of-Experts golden fixtures of tests/runtime/golden/: for three tiny LLaMA
MoE models (Mixtral-style renormalised top-k, Qwen2-MoE-style gated shared expert, DeepSeek-style
leading dense block and ungated shared experts) the logits, the cross-entropy, the load-balancing
loss in the form of the model's family, every gradient of the objective (cross-entropy + aux_coef
x load-balancing loss) and the cross-entropy and load-balancing loss of 10 AdamW steps, computed
by PyTorch in float64.
    /usr/bin/python3 scripts/golden_moe.py [output_dir]
The MoE MLP here is written the way Hugging Face's Mixtral and Qwen2-MoE write theirs (a loop
over experts, each taking its tokens with torch.where and adding back with index_add), not the
way Alloy does (one permutation grouped by expert), so the two are independent. The
load-balancing loss E * sum_e f_e P_e (f_e: share of the top-k picks that chose expert e, P_e:
mean router probability of e) is "pooled" for Mixtral and Qwen2-MoE (one f and P over the rows of
every MoE block stacked, as their Hugging Face loss concatenates every layer's router logits) and
"per_block" for DeepSeek (each block's own f and P, the blocks' terms averaged). Weights are
golden.py's splitmix64 weights (router weights scaled up so that routing is decisive)."""

import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden  # noqa: E402
import torch_reference  # noqa: E402

BASE = dict(family="llama", hidden=32, heads=4, kv_heads=2, head_dim=8, ffn=48, vocab=64,
            max_seq_len=32, tied=False, qkv_bias=False, linear_bias=False, norm_bias=False,
            eps=1e-5, rope_theta=10000.0)
CONFIGS = {
    "tiny_moe_mixtral": dict(BASE, layers=2, moe=dict(
        experts=4, experts_per_token=2, expert_ffn=16, shared_experts=0, shared_ffn=0,
        shared_gate=False, first_dense_layers=0, norm_topk_prob=True, aux_coef=0.02, balance="pooled")),
    "tiny_moe_qwen": dict(BASE, layers=2, moe=dict(
        experts=6, experts_per_token=3, expert_ffn=16, shared_experts=1, shared_ffn=24,
        shared_gate=True, first_dense_layers=0, norm_topk_prob=False, aux_coef=0.01, balance="pooled")),
    "tiny_moe_deepseek": dict(BASE, layers=3, moe=dict(
        experts=4, experts_per_token=2, expert_ffn=16, shared_experts=2, shared_ffn=16,
        shared_gate=False, first_dense_layers=1, norm_topk_prob=False, aux_coef=0.01, balance="per_block")),
}
BATCH, SEQ = 2, 12
ROUTER_SCALE = 0.5  # router weights: 0.5 x, not golden.py's 0.08 x


def is_moe_block(cfg, i):
    return i >= cfg["moe"]["first_dense_layers"]


def parameter_shapes(cfg):
    """Alloy's flat order: a dense model's tensors with each MoE block's MLP replaced by router,
    experts.e.gate_up / experts.e.down per expert, shared.gate_up / shared.down, shared_gate."""
    moe, C = cfg["moe"], cfg["hidden"]
    Fe, Fs = moe["expert_ffn"], moe["shared_experts"] * moe["shared_ffn"]
    shapes = []
    for name, shape in torch_reference.parameter_shapes(cfg):
        parts = name.split(".")
        if parts[0] != "layers" or not is_moe_block(cfg, int(parts[1])) or parts[2] != "mlp":
            shapes.append((name, shape))
            continue
        if parts[3] != "gate_up":
            continue  # the dense MLP's down: the MoE MLP was added in its place at gate_up
        p = f"layers.{parts[1]}.mlp."
        shapes.append((p + "router.weight", (moe["experts"], C)))
        for e in range(moe["experts"]):
            shapes.append((p + f"experts.{e}.gate_up.weight", (2 * Fe, C)))
            shapes.append((p + f"experts.{e}.down.weight", (C, Fe)))
        if Fs > 0:
            shapes.append((p + "shared.gate_up.weight", (2 * Fs, C)))
            shapes.append((p + "shared.down.weight", (C, Fs)))
            if moe["shared_gate"]:
                shapes.append((p + "shared_gate.weight", (1, C)))
    return shapes


def golden_moe_weights(cfg):
    """golden.golden_weights' rule over this flat order, router weights scaled by ROUTER_SCALE."""
    weights = {}
    for k, (name, shape) in enumerate(parameter_shapes(cfg)):
        n = int(np.prod(shape))
        keys = (np.uint64(k) << np.uint64(32)) | np.arange(n, dtype=np.uint64)
        u = (golden.splitmix64(keys) >> np.uint64(40)).astype(np.float64) / float(1 << 24)
        x = 2.0 * u - 1.0
        if name.endswith("router.weight"):
            values = ROUTER_SCALE * x
        elif len(shape) == 2:
            scale = 0.08
            if name.endswith("attn.out.weight") or name.endswith("mlp.down.weight"):
                scale /= np.sqrt(2.0 * cfg["layers"])
            values = scale * x
        elif name.endswith("norm.weight"):
            values = 1.0 + 0.2 * x
        else:
            values = 0.05 * x
        weights[name] = values.astype(np.float32).reshape(shape)
    return weights


def swiglu_mlp(x, gate_up, down):
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down)


def moe_mlp(cfg, x, params, prefix):
    """x: (B, T, C) -> (MoE MLP output, (B T, E) router probabilities, (B T, E) picks: 1 where the
    token sent one of its top-k to the expert)."""
    moe = cfg["moe"]
    E, K = moe["experts"], moe["experts_per_token"]
    B, T, C = x.shape
    h = x.reshape(-1, C)
    probs = F.linear(h, params[prefix + "router.weight"]).softmax(dim=-1)
    weights, selected = torch.topk(probs, K, dim=-1)
    if moe["norm_topk_prob"]:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(h)
    for e in range(E):
        token, slot = torch.where(selected == e)
        y = swiglu_mlp(h[token], params[f"{prefix}experts.{e}.gate_up.weight"],
                       params[f"{prefix}experts.{e}.down.weight"])
        out = out.index_add(0, token, y * weights[token, slot].unsqueeze(-1))
    if moe["shared_experts"] > 0:
        shared = swiglu_mlp(h, params[prefix + "shared.gate_up.weight"], params[prefix + "shared.down.weight"])
        if moe["shared_gate"]:
            shared = torch.sigmoid(F.linear(h, params[prefix + "shared_gate.weight"])) * shared
        out = out + shared
    picked = F.one_hot(selected, E).sum(dim=1).to(probs.dtype)
    return out.view(B, T, C), probs, picked


def balance_term(E, probs, picked):
    """Switch / Mixtral: E * sum_e f_e P_e over the rows given, f_e the mean of picks of e (so
    sum_e f_e = top-k), P_e the mean probability of e. picks are constant: no gradient."""
    return E * (picked.mean(dim=0) * probs.mean(dim=0)).sum()


def balance_loss(cfg, routers, form):
    """routers: (probs, picked) of every MoE block -> the load-balancing loss of `form`."""
    E = cfg["moe"]["experts"]
    if form == "pooled":
        return balance_term(E, torch.cat([p for p, _ in routers]), torch.cat([k for _, k in routers]))
    return torch.stack([balance_term(E, p, k) for p, k in routers]).mean()


def forward(cfg, params, inputs, targets, form=None):
    """-> (logits, cross-entropy, load-balancing loss of `form`, the config's by default)."""
    x = params["embed.token"][inputs]
    routers = []
    for i in range(cfg["layers"]):
        p = f"layers.{i}."
        x = x + torch_reference._attention(cfg, torch_reference._norm(cfg, x, params, p + "attn_norm"), params,
                                           p + "attn.")
        hidden = torch_reference._norm(cfg, x, params, p + "mlp_norm")
        if is_moe_block(cfg, i):
            mlp, probs, picked = moe_mlp(cfg, hidden, params, p + "mlp.")
            routers.append((probs, picked))
        else:
            mlp = torch_reference._mlp(cfg, hidden, params, p + "mlp.")
        x = x + mlp
    x = torch_reference._norm(cfg, x, params, "final_norm")
    logits = F.linear(x, params["lm_head.weight"])
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
    return logits, loss, balance_loss(cfg, routers, form or cfg["moe"]["balance"])


def reference(cfg, weights, inputs, targets):
    """The first forward's logits, cross-entropy, load-balancing loss (the config's form and the
    other one) and objective gradients, then 10 AdamW steps on the objective."""
    params = {name: torch.tensor(w, dtype=torch.float64, requires_grad=True) for name, w in weights.items()}
    other = "per_block" if cfg["moe"]["balance"] == "pooled" else "pooled"
    with torch.no_grad():
        _, _, other_aux = forward(cfg, params, inputs, targets, other)
    logits, loss, aux = forward(cfg, params, inputs, targets)
    (loss + cfg["moe"]["aux_coef"] * aux).backward()
    grads = {name: t.grad.detach().clone() for name, t in params.items()}
    hyper = golden.HYPER
    optimizer = torch_reference.make_optimizer(params, hyper["lr"], (hyper["beta1"], hyper["beta2"]), hyper["eps"],
                                               hyper["weight_decay"])
    step_losses, step_aux, step_norms = [], [], []
    for _ in range(golden.STEPS):
        optimizer.zero_grad()
        _, step_loss, step_balance = forward(cfg, params, inputs, targets)
        (step_loss + cfg["moe"]["aux_coef"] * step_balance).backward()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), hyper["grad_clip"])
        optimizer.step()
        step_losses.append(step_loss.item())
        step_aux.append(step_balance.item())
        step_norms.append(float(norm))
    return dict(logits=logits.detach(), loss=loss.item(), aux=aux.item(), other_aux=other_aux.item(), grads=grads,
                step_losses=step_losses, step_aux=step_aux, step_norms=step_norms)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "runtime", "golden")
    os.makedirs(out_dir, exist_ok=True)
    for name, cfg in CONFIGS.items():
        generator = torch.Generator().manual_seed(4321)
        tokens = torch.randint(0, cfg["vocab"], (BATCH, SEQ + 1), generator=generator)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        weights = golden_moe_weights(cfg)
        r = reference(cfg, weights, inputs, targets)
        tensors = {
            "inputs": inputs.numpy().astype(np.int32),
            "targets": targets.numpy().astype(np.int32),
            "logits": r["logits"].numpy().astype(np.float32),
            "loss": np.array([r["loss"]], dtype=np.float32),
            "aux_loss": np.array([r["aux"]], dtype=np.float32),
            "aux_loss_other_form": np.array([r["other_aux"]], dtype=np.float32),
            "step_losses": np.array(r["step_losses"], dtype=np.float32),
            "step_aux_losses": np.array(r["step_aux"], dtype=np.float32),
            "step_grad_norms": np.array(r["step_norms"], dtype=np.float32),
        }
        for param, grad in r["grads"].items():
            tensors["grad." + param] = grad.numpy().astype(np.float32)
        metadata = {
            "config": json.dumps(cfg),
            "hyper": json.dumps(golden.HYPER),
            "router_scale": repr(ROUTER_SCALE),
            "weight_sums": json.dumps({k: float(w.astype(np.float64).sum()) for k, w in weights.items()}),
            "loss_f64": repr(r["loss"]),
            "aux_loss_f64": repr(r["aux"]),
            "step_losses_f64": json.dumps(r["step_losses"]),
            "note": "computed in float64 by PyTorch " + torch.__version__,
        }
        path = os.path.join(out_dir, name + ".safetensors")
        golden.write_safetensors(path, tensors, metadata)
        gap = (r["other_aux"] - r["aux"]) / r["aux"]
        print(f"{name}: cross-entropy {r['loss']:.6f}, {cfg['moe']['balance']} load-balancing loss {r['aux']:.6f} "
              f"(the other form: {r['other_aux']:.6f}, {100 * gap:+.1f}%), 10-step cross-entropy "
              f"{r['step_losses'][0]:.6f} .. {r['step_losses'][-1]:.6f}, {os.path.getsize(path)} bytes -> {path}")


if __name__ == "__main__":
    main()
