#!/usr/bin/python3
"""Times PyTorch on the model Alloy's bench_train_vs_torch times: forward, backward, global-norm
clipping and AdamW per step, float32, on a fixed random batch. Prints one JSON line.
    /usr/bin/python3 bench/torch_step.py --family gpt2 --layers 4 --hidden 256 --heads 4 \
        --kv-heads 4 --ffn 1024 --vocab 4096 --seq 128 --batch 8 --threads 1 --steps 5"""

import argparse
import ctypes
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import torch_reference  # noqa: E402


def blas_core():
    """OpenBLAS's kernel family in this process (torch loads the same libblas.so.3), or "unknown"."""
    try:
        corename = ctypes.CDLL("libblas.so.3").openblas_get_corename
    except (OSError, AttributeError):
        return "unknown"
    corename.restype = ctypes.c_char_p
    return corename().decode()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", choices=["gpt2", "llama"], required=True)
    for name in ["layers", "hidden", "heads", "kv-heads", "ffn", "vocab", "seq", "batch",
                 "threads", "steps"]:
        parser.add_argument("--" + name, type=int, required=True)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gpt2 = args.family == "gpt2"
    cfg = dict(family=args.family, layers=args.layers, hidden=args.hidden, heads=args.heads,
               kv_heads=args.kv_heads, head_dim=args.hidden // args.heads, ffn=args.ffn,
               vocab=args.vocab, max_seq_len=args.seq, tied=gpt2, qkv_bias=gpt2,
               linear_bias=gpt2, norm_bias=gpt2, eps=1e-5, rope_theta=10000.0)
    torch.manual_seed(0)
    params = {}
    for name, shape in torch_reference.parameter_shapes(cfg):
        if len(shape) == 2:
            tensor = torch.randn(shape) * 0.02
        elif name.endswith("norm.weight"):
            tensor = torch.ones(shape)
        else:
            tensor = torch.zeros(shape)
        params[name] = tensor.requires_grad_(True)
    optimizer = torch_reference.make_optimizer(params, 3e-4, (0.9, 0.95), 1e-8, 0.1)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step():
        optimizer.zero_grad(set_to_none=False)
        _, loss = torch_reference.forward(cfg, params, inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        optimizer.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    times, cpu_times = [], []
    for _ in range(args.steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = step()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    print(json.dumps({"torch_version": torch.__version__, "threads": torch.get_num_threads(),
                      "blas_core": blas_core(),
                      "seconds_per_step_min": min(times),
                      "seconds_per_step_median": sorted(times)[len(times) // 2],
                      "cpu_seconds_per_step_min": min(cpu_times),
                      "loss": loss}))


if __name__ == "__main__":
    main()
