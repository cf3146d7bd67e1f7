#!/usr/bin/python3
"""Writes the Mixture-of-Experts golden fixtures of tests/runtime/golden/: for three tiny LLaMA
MoE models (Mixtral-style renormalised top-k, Qwen2-MoE-style gated shared expert, DeepSeek-style
leading dense block and ungated shared experts) the logits, the loss with the load-balancing
loss, every parameter gradient and the losses of 10 AdamW steps, computed by PyTorch in float64.
    /usr/bin/python3 scripts/golden_moe.py [output_dir]
The MoE MLP here is written the way Hugging Face's Mixtral and Qwen2-MoE write theirs (a loop
over experts, each taking its tokens with torch.where and adding back with index_add), not the
way Alloy does (one permutation grouped by expert), so the two are independent. Weights are
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
        shared_gate=False, first_dense_layers=0, norm_topk_prob=True, aux_coef=0.02)),
    "tiny_moe_qwen": dict(BASE, layers=2, moe=dict(
        experts=6, experts_per_token=3, expert_ffn=16, shared_experts=1, shared_ffn=24,
        shared_gate=True, first_dense_layers=0, norm_topk_prob=False, aux_coef=0.01)),
    "tiny_moe_deepseek": dict(BASE, layers=3, moe=dict(
        experts=4, experts_per_token=2, expert_ffn=16, shared_experts=2, shared_ffn=16,
        shared_gate=False, first_dense_layers=1, norm_topk_prob=False, aux_coef=0.01)),
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
    """x: (B, T, C) -> (MoE MLP output, this block's load-balancing loss)."""
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
    # Switch / Mixtral: E * sum_e f_e P_e, f_e the fraction of tokens with e among their top-k.
    picked = F.one_hot(selected, E).sum(dim=1).to(probs.dtype)
    aux = E * (picked.mean(dim=0) * probs.mean(dim=0)).sum()
    return out.view(B, T, C), aux


def forward(cfg, params, inputs, targets):
    """-> (logits, cross-entropy + aux_coef x the MoE blocks' mean load-balancing loss)."""
    x = params["embed.token"][inputs]
    aux_losses = []
    for i in range(cfg["layers"]):
        p = f"layers.{i}."
        x = x + torch_reference._attention(cfg, torch_reference._norm(cfg, x, params, p + "attn_norm"), params,
                                           p + "attn.")
        hidden = torch_reference._norm(cfg, x, params, p + "mlp_norm")
        if is_moe_block(cfg, i):
            mlp, aux = moe_mlp(cfg, hidden, params, p + "mlp.")
            aux_losses.append(aux)
        else:
            mlp = torch_reference._mlp(cfg, hidden, params, p + "mlp.")
        x = x + mlp
    x = torch_reference._norm(cfg, x, params, "final_norm")
    logits = F.linear(x, params["lm_head.weight"])
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
    aux = torch.stack(aux_losses).mean()
    return logits, loss + cfg["moe"]["aux_coef"] * aux, aux


def reference(cfg, weights, inputs, targets):
    params = {name: torch.tensor(w, dtype=torch.float64, requires_grad=True) for name, w in weights.items()}
    logits, loss, aux = forward(cfg, params, inputs, targets)
    loss.backward()
    grads = {name: t.grad.detach().clone() for name, t in params.items()}
    hyper = golden.HYPER
    optimizer = torch_reference.make_optimizer(params, hyper["lr"], (hyper["beta1"], hyper["beta2"]), hyper["eps"],
                                               hyper["weight_decay"])
    step_losses, step_norms = [], []
    for _ in range(golden.STEPS):
        optimizer.zero_grad()
        _, step_loss, _ = forward(cfg, params, inputs, targets)
        step_loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), hyper["grad_clip"])
        optimizer.step()
        step_losses.append(step_loss.item())
        step_norms.append(float(norm))
    return logits.detach(), loss.item(), aux.item(), grads, step_losses, step_norms


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "runtime", "golden")
    os.makedirs(out_dir, exist_ok=True)
    for name, cfg in CONFIGS.items():
        generator = torch.Generator().manual_seed(4321)
        tokens = torch.randint(0, cfg["vocab"], (BATCH, SEQ + 1), generator=generator)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        weights = golden_moe_weights(cfg)
        logits, loss, aux, grads, step_losses, step_norms = reference(cfg, weights, inputs, targets)
        tensors = {
            "inputs": inputs.numpy().astype(np.int32),
            "targets": targets.numpy().astype(np.int32),
            "logits": logits.numpy().astype(np.float32),
            "loss": np.array([loss], dtype=np.float32),
            "aux_loss": np.array([aux], dtype=np.float32),
            "step_losses": np.array(step_losses, dtype=np.float32),
            "step_grad_norms": np.array(step_norms, dtype=np.float32),
        }
        for param, grad in grads.items():
            tensors["grad." + param] = grad.numpy().astype(np.float32)
        metadata = {
            "config": json.dumps(cfg),
            "hyper": json.dumps(golden.HYPER),
            "router_scale": repr(ROUTER_SCALE),
            "weight_sums": json.dumps({k: float(w.astype(np.float64).sum()) for k, w in weights.items()}),
            "loss_f64": repr(loss),
            "step_losses_f64": json.dumps(step_losses),
            "note": "computed in float64 by PyTorch " + torch.__version__,
        }
        path = os.path.join(out_dir, name + ".safetensors")
        golden.write_safetensors(path, tensors, metadata)
        print(f"{name}: loss {loss:.6f} (aux {aux:.6f}), 10-step losses {step_losses[0]:.6f} .. "
              f"{step_losses[-1]:.6f}, {os.path.getsize(path)} bytes -> {path}")


if __name__ == "__main__":
    main()
