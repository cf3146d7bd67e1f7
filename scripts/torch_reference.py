"""PyTorch twin of Alloy's single-rank model (src/runtime/model.hpp): the same parameter names
and layouts, as plain tensors in a dict, so fixtures and benchmarks compare like with like.
Used by scripts/golden.py and bench/torch_step.py."""

import math

import torch
import torch.nn.functional as F


def parameter_shapes(cfg):
    """Ordered (name, shape) list, the order of Alloy's flat parameter buffer."""
    C, D, F_ = cfg["hidden"], cfg["head_dim"], cfg["ffn"]
    Hq, Hkv, V = cfg["heads"], cfg["kv_heads"], cfg["vocab"]
    gpt2 = cfg["family"] == "gpt2"
    shapes = [("embed.token", (V, C))]
    if gpt2:
        shapes.append(("embed.position", (cfg["max_seq_len"], C)))
    for i in range(cfg["layers"]):
        p = f"layers.{i}."
        shapes.append((p + "attn_norm.weight", (C,)))
        if cfg["norm_bias"]:
            shapes.append((p + "attn_norm.bias", (C,)))
        shapes.append((p + "attn.qkv.weight", ((Hq + 2 * Hkv) * D, C)))
        if cfg["qkv_bias"]:
            shapes.append((p + "attn.qkv.bias", ((Hq + 2 * Hkv) * D,)))
        shapes.append((p + "attn.out.weight", (C, Hq * D)))
        if cfg["linear_bias"]:
            shapes.append((p + "attn.out.bias", (C,)))
        shapes.append((p + "mlp_norm.weight", (C,)))
        if cfg["norm_bias"]:
            shapes.append((p + "mlp_norm.bias", (C,)))
        if gpt2:
            shapes.append((p + "mlp.up.weight", (F_, C)))
            if cfg["linear_bias"]:
                shapes.append((p + "mlp.up.bias", (F_,)))
        else:
            shapes.append((p + "mlp.gate_up.weight", (2 * F_, C)))
        shapes.append((p + "mlp.down.weight", (C, F_)))
        if cfg["linear_bias"]:
            shapes.append((p + "mlp.down.bias", (C,)))
    shapes.append(("final_norm.weight", (C,)))
    if cfg["norm_bias"]:
        shapes.append(("final_norm.bias", (C,)))
    if not cfg["tied"]:
        shapes.append(("lm_head.weight", (V, C)))
    return shapes


def _norm(cfg, x, params, prefix):
    w = params[prefix + ".weight"]
    if cfg["family"] == "gpt2":
        return F.layer_norm(x, (x.shape[-1],), w, params.get(prefix + ".bias"), cfg["eps"])
    rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["eps"])
    return x * rms * w


def _rope(x, theta):
    """x: (B, H, T, D); rotate-half pairs (i, i + D/2) by t * theta^(-2i/D)."""
    T, D = x.shape[-2], x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, D // 2, dtype=torch.float64) * 2.0 / D)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], -1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], -1).to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _attention(cfg, x, params, prefix):
    B, T, _ = x.shape
    Hq, Hkv, D = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    qkv = F.linear(x, params[prefix + "qkv.weight"], params.get(prefix + "qkv.bias"))
    q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=-1)
    q = q.view(B, T, Hq, D).transpose(1, 2)
    k = k.view(B, T, Hkv, D).transpose(1, 2)
    v = v.view(B, T, Hkv, D).transpose(1, 2)
    if cfg["family"] == "llama":
        q, k = _rope(q, cfg["rope_theta"]), _rope(k, cfg["rope_theta"])
    if Hkv != Hq:
        k = k.repeat_interleave(Hq // Hkv, dim=1)
        v = v.repeat_interleave(Hq // Hkv, dim=1)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
    context = (probs @ v).transpose(1, 2).reshape(B, T, Hq * D)
    return F.linear(context, params[prefix + "out.weight"], params.get(prefix + "out.bias"))


def _mlp(cfg, x, params, prefix):
    if cfg["family"] == "gpt2":
        h = F.linear(x, params[prefix + "up.weight"], params.get(prefix + "up.bias"))
        h = F.gelu(h, approximate="tanh")
    else:
        gate, up = F.linear(x, params[prefix + "gate_up.weight"]).chunk(2, dim=-1)
        h = F.silu(gate) * up
    return F.linear(h, params[prefix + "down.weight"], params.get(prefix + "down.bias"))


def forward(cfg, params, inputs, targets):
    """inputs, targets: (B, T) int64 -> (logits (B, T, V), mean cross-entropy loss)."""
    T = inputs.shape[1]
    x = params["embed.token"][inputs]
    if cfg["family"] == "gpt2":
        x = x + params["embed.position"][:T]
    for i in range(cfg["layers"]):
        p = f"layers.{i}."
        x = x + _attention(cfg, _norm(cfg, x, params, p + "attn_norm"), params, p + "attn.")
        x = x + _mlp(cfg, _norm(cfg, x, params, p + "mlp_norm"), params, p + "mlp.")
    x = _norm(cfg, x, params, "final_norm")
    head = params["embed.token"] if cfg["tied"] else params["lm_head.weight"]
    logits = F.linear(x, head)
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
    return logits, loss


def make_optimizer(params, lr, betas, eps, weight_decay):
    """AdamW with decay on 2-D weights only, like Alloy's optimizer_step."""
    decay = [t for t in params.values() if t.dim() == 2]
    no_decay = [t for t in params.values() if t.dim() != 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)
