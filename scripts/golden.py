#!/usr/bin/python3
"""Writes the golden fixtures of tests/runtime/golden/: for two tiny models (GPT-2 and LLaMA
families) the logits, loss, every parameter gradient and the losses of 10 AdamW steps, computed
by PyTorch in float64 from deterministic weights. Run with Debian's python3-torch:
    /usr/bin/python3 scripts/golden.py [output_dir]
Weights are not stored: both sides generate them with splitmix64 (see golden_weights below and
tests/runtime/golden_test.cpp); the fixture keeps each weight tensor's sum to check that."""

import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference  # noqa: E402

CONFIGS = {
    "tiny_gpt": dict(family="gpt2", layers=2, hidden=64, heads=4, kv_heads=4, head_dim=16,
                     ffn=256, vocab=256, max_seq_len=64, tied=True, qkv_bias=True,
                     linear_bias=True, norm_bias=True, eps=1e-5, rope_theta=10000.0),
    "tiny_llama": dict(family="llama", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16,
                       ffn=176, vocab=256, max_seq_len=64, tied=False, qkv_bias=False,
                       linear_bias=False, norm_bias=False, eps=1e-5, rope_theta=10000.0),
}
BATCH, SEQ = 2, 16
STEPS = 10
HYPER = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)

MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(x):
    """x: uint64 array -> uint64 array; wraps modulo 2^64 like the C++ twin."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def golden_weights(cfg):
    """Tensor k, element i: x = 2 u - 1 with u = (splitmix64(k << 32 | i) >> 40) / 2^24;
    2-D weights 0.08 x (residual projections / sqrt(2 L)), norm weights 1 + 0.2 x, biases 0.05 x;
    computed in double, rounded once to float32."""
    weights = {}
    for k, (name, shape) in enumerate(torch_reference.parameter_shapes(cfg)):
        n = int(np.prod(shape))
        keys = (np.uint64(k) << np.uint64(32)) | np.arange(n, dtype=np.uint64)
        u = (splitmix64(keys) >> np.uint64(40)).astype(np.float64) / float(1 << 24)
        x = 2.0 * u - 1.0
        if len(shape) == 2:
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


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, array in tensors.items():
        dtype = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}[array.dtype]
        data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def reference(cfg, weights, inputs, targets):
    params = {name: torch.tensor(w, dtype=torch.float64, requires_grad=True)
              for name, w in weights.items()}
    logits, loss = torch_reference.forward(cfg, params, inputs, targets)
    loss.backward()
    grads = {name: t.grad.detach().clone() for name, t in params.items()}

    optimizer = torch_reference.make_optimizer(
        params, HYPER["lr"], (HYPER["beta1"], HYPER["beta2"]), HYPER["eps"],
        HYPER["weight_decay"])
    step_losses, step_norms = [], []
    for _ in range(STEPS):
        optimizer.zero_grad()
        _, step_loss = torch_reference.forward(cfg, params, inputs, targets)
        step_loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), HYPER["grad_clip"])
        optimizer.step()
        step_losses.append(step_loss.item())
        step_norms.append(float(norm))
    return logits.detach(), loss.item(), grads, step_losses, step_norms


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "runtime", "golden")
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    for name, cfg in CONFIGS.items():
        generator = torch.Generator().manual_seed(1234)
        tokens = torch.randint(0, cfg["vocab"], (BATCH, SEQ + 1), generator=generator)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        weights = golden_weights(cfg)
        logits, loss, grads, step_losses, step_norms = reference(cfg, weights, inputs, targets)
        tensors = {
            "inputs": inputs.numpy().astype(np.int32),
            "targets": targets.numpy().astype(np.int32),
            "logits": logits.numpy().astype(np.float32),
            "loss": np.array([loss], dtype=np.float32),
            "step_losses": np.array(step_losses, dtype=np.float32),
            "step_grad_norms": np.array(step_norms, dtype=np.float32),
        }
        for param, grad in grads.items():
            tensors["grad." + param] = grad.numpy().astype(np.float32)
        metadata = {
            "config": json.dumps(cfg),
            "hyper": json.dumps(HYPER),
            "weight_sums": json.dumps({k: float(w.astype(np.float64).sum())
                                       for k, w in weights.items()}),
            "loss_f64": repr(loss),
            "step_losses_f64": json.dumps(step_losses),
            "note": "computed in float64 by PyTorch " + torch.__version__,
        }
        path = os.path.join(out_dir, name + ".safetensors")
        write_safetensors(path, tensors, metadata)
        print(f"{name}: loss {loss:.6f}, 10-step losses {step_losses[0]:.6f} .. "
              f"{step_losses[-1]:.6f}, grad norms {step_norms[0]:.4f} .. {step_norms[-1]:.4f}, "
              f"{os.path.getsize(path)} bytes -> {path}")


if __name__ == "__main__":
    main()
