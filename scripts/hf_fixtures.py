#!/usr/bin/python3
"""Writes the Hugging Face fixtures of tests/io/hf/: two tiny models in the layout transformers
saves (GPT-2 with its Conv1D [in, out] matrices and a "transformer." prefix; LLaMA with separate
q/k/v and gate/up projections, in two shards with model.safetensors.index.json), each with its
config.json, random weights, and the logits an independent float64 PyTorch implementation of the
Hugging Face architectures computes for fixed tokens (reference.safetensors; the token ids as F32,
which holds them exactly). Run with Debian's
python3-torch:
    /usr/bin/python3 scripts/hf_fixtures.py [output_dir]"""

import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden  # noqa: E402

TOKENS = 16


def write_safetensors(path, tensors):
    """scripts/golden.py's writer, for torch tensors."""
    golden.write_safetensors(path, {name: t.contiguous().numpy() for name, t in tensors.items()}, {"format": "pt"})


def gpt2_weights(cfg, g):
    C, L, V, P, Fi = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"], cfg["n_positions"], 4 * cfg["n_embd"]
    w = {"transformer.wte.weight": torch.randn(V, C, generator=g) * 0.1,
         "transformer.wpe.weight": torch.randn(P, C, generator=g) * 0.05}
    for i in range(L):
        p = f"transformer.h.{i}."
        w[p + "ln_1.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
        w[p + "ln_1.bias"] = 0.05 * torch.randn(C, generator=g)
        w[p + "attn.c_attn.weight"] = 0.08 * torch.randn(C, 3 * C, generator=g)
        w[p + "attn.c_attn.bias"] = 0.05 * torch.randn(3 * C, generator=g)
        w[p + "attn.c_proj.weight"] = 0.05 * torch.randn(C, C, generator=g)
        w[p + "attn.c_proj.bias"] = 0.05 * torch.randn(C, generator=g)
        w[p + "ln_2.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
        w[p + "ln_2.bias"] = 0.05 * torch.randn(C, generator=g)
        w[p + "mlp.c_fc.weight"] = 0.08 * torch.randn(C, Fi, generator=g)
        w[p + "mlp.c_fc.bias"] = 0.05 * torch.randn(Fi, generator=g)
        w[p + "mlp.c_proj.weight"] = 0.05 * torch.randn(Fi, C, generator=g)
        w[p + "mlp.c_proj.bias"] = 0.05 * torch.randn(C, generator=g)
    w["transformer.ln_f.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
    w["transformer.ln_f.bias"] = 0.05 * torch.randn(C, generator=g)
    return w


def gpt2_logits(cfg, w, ids):
    """GPT2LMHeadModel's forward as transformers defines it, in float64."""
    w = {k: v.double() for k, v in w.items()}
    C, H, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    T = ids.shape[0]
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        a = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        q, k, v = (a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]).split(C, dim=-1)
        q, k, v = (t.view(T, H, C // H).transpose(0, 1) for t in (q, k, v))
        probs = ((q @ k.transpose(-2, -1)) / math.sqrt(C // H)).masked_fill(mask, float("-inf")).softmax(-1)
        context = (probs @ v).transpose(0, 1).reshape(T, C)
        x = x + context @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        m = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = F.gelu(m @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    return x @ w["transformer.wte.weight"].T


def llama_weights(cfg, g):
    C, L, V, Fi = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"], cfg["intermediate_size"]
    Hq, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = C // Hq
    w = {"model.embed_tokens.weight": 0.1 * torch.randn(V, C, generator=g)}
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
        w[p + "self_attn.q_proj.weight"] = 0.08 * torch.randn(Hq * D, C, generator=g)
        w[p + "self_attn.k_proj.weight"] = 0.08 * torch.randn(Hkv * D, C, generator=g)
        w[p + "self_attn.v_proj.weight"] = 0.08 * torch.randn(Hkv * D, C, generator=g)
        w[p + "self_attn.o_proj.weight"] = 0.05 * torch.randn(C, Hq * D, generator=g)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
        w[p + "mlp.gate_proj.weight"] = 0.08 * torch.randn(Fi, C, generator=g)
        w[p + "mlp.up_proj.weight"] = 0.08 * torch.randn(Fi, C, generator=g)
        w[p + "mlp.down_proj.weight"] = 0.05 * torch.randn(C, Fi, generator=g)
    w["model.norm.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
    w["lm_head.weight"] = 0.1 * torch.randn(V, C, generator=g)
    return w


def llama_logits(cfg, w, ids):
    """LlamaForCausalLM's forward as transformers defines it (rotate_half RoPE, repeat_kv), float64."""
    w = {k: v.double() for k, v in w.items()}
    C, Hq, Hkv, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["rms_norm_eps"]
    D, T = C // Hq, ids.shape[0]

    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()

    def rotate(x):
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms(x, w[p + "input_layernorm.weight"])
        q = (a @ w[p + "self_attn.q_proj.weight"].T).view(T, Hq, D).transpose(0, 1)
        k = (a @ w[p + "self_attn.k_proj.weight"].T).view(T, Hkv, D).transpose(0, 1)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).view(T, Hkv, D).transpose(0, 1)
        q, k = rotate(q), rotate(k)
        rep = Hq // Hkv
        k = k[:, None].expand(Hkv, rep, T, D).reshape(Hq, T, D)
        v = v[:, None].expand(Hkv, rep, T, D).reshape(Hq, T, D)
        probs = ((q @ k.transpose(-2, -1)) / math.sqrt(D)).masked_fill(mask, float("-inf")).softmax(-1)
        x = x + (probs @ v).transpose(0, 1).reshape(T, Hq * D) @ w[p + "self_attn.o_proj.weight"].T
        m = rms(x, w[p + "post_attention_layernorm.weight"])
        h = F.silu(m @ w[p + "mlp.gate_proj.weight"].T) * (m @ w[p + "mlp.up_proj.weight"].T)
        x = x + h @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "io", "hf")
    g = torch.Generator().manual_seed(20261203)
    gpt2 = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 64, "n_ctx": 64,
            "vocab_size": 256, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
            "tie_word_embeddings": True, "architectures": ["GPT2LMHeadModel"]}
    llama = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 176, "num_attention_heads": 4,
             "num_key_value_heads": 2, "num_hidden_layers": 2, "max_position_embeddings": 64, "vocab_size": 256,
             "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
             "architectures": ["LlamaForCausalLM"]}
    for name, cfg, make, logits_of in (("tiny_gpt2", gpt2, gpt2_weights, gpt2_logits),
                                       ("tiny_llama", llama, llama_weights, llama_logits)):
        folder = os.path.join(out, name)
        os.makedirs(folder, exist_ok=True)
        weights = {k: v.float() for k, v in make(cfg, g).items()}
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        if name == "tiny_llama":  # two shards and their index, as transformers writes large models
            names = list(weights)
            shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
                      "model-00002-of-00002.safetensors": names[len(names) // 2:]}
            index = {"metadata": {"total_size": sum(t.numel() * 4 for t in weights.values())}, "weight_map": {}}
            for file, keys in shards.items():
                write_safetensors(os.path.join(folder, file), {k: weights[k] for k in keys})
                index["weight_map"].update({k: file for k in keys})
            with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
                json.dump(index, f, indent=2)
        else:
            write_safetensors(os.path.join(folder, "model.safetensors"), weights)
        ids = torch.randint(0, cfg["vocab_size"], (TOKENS,), generator=g)
        logits = logits_of(cfg, weights, ids).float()
        write_safetensors(os.path.join(folder, "reference.safetensors"),
                          {"tokens": ids.to(torch.float32), "logits": logits})
        print(f"{folder}: {len(weights)} tensors, logits {tuple(logits.shape)}")


if __name__ == "__main__":
    main()
