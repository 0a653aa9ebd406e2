"""Forward + backward time of transformers' Mamba and Mamba-2 models with their mixers' scan on
ssm-scan (``ssm_torch.hf.patch``) against the same model on transformers' own PyTorch path, in
one process, rounds interleaved (unpatched, patched, unpatched, ...); on the CPU, or with
``--device cuda`` on a GPU (CUDA tensors through ``backend="ssm_vk"``).

    python benchmarks/hf_patch.py [--rounds 5] [--backend ssm_fast] [--device cpu] [--json out.json]

Models are built from small random configurations (nothing downloaded): each step is
``model(ids, labels=ids).loss.backward()``. Prints the median step time of each and the ratio
(unpatched / patched: above 1, the patched model is faster), with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch
import transformers

from ssm_torch import hf


def mamba1():
    cfg = transformers.MambaConfig(vocab_size=1024, hidden_size=256, state_size=16, num_hidden_layers=2, expand=2,
                                   conv_kernel=4, time_step_rank=16)
    return transformers.MambaForCausalLM(cfg)


def mamba2():
    cfg = transformers.Mamba2Config(vocab_size=1024, hidden_size=256, num_heads=8, head_dim=64, n_groups=1,
                                    state_size=64, chunk_size=64, num_hidden_layers=2, expand=2, conv_kernel=4)
    return transformers.Mamba2ForCausalLM(cfg)


def step_time(model, ids) -> float:
    model.zero_grad(set_to_none=True)
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    sync()
    t = time.perf_counter()
    model(ids, labels=ids, use_cache=False).loss.backward()
    sync()      # the step's GPU work is part of its time
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backend", default=None, help="ssm_torch backend (default: the drop-ins' own, ssm_fast)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seqlen", type=int, default=256)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (then use --backend ssm_vk)")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.manual_seed(0)
    ids = torch.randint(0, 1024, (a.batch, a.seqlen), generator=torch.Generator().manual_seed(1)).to(a.device)
    rows = []
    for name, build in (("mamba1", mamba1), ("mamba2", mamba2)):
        plain = build().train().to(a.device)
        patched = build().train().to(a.device)
        patched.load_state_dict(plain.state_dict())
        hf.patch(patched, backend=a.backend)
        for m in (plain, patched):       # warm: compile, caches, first-touch
            step_time(m, ids)
        times = {"transformers": [], "patched": []}
        for _ in range(a.rounds):
            times["transformers"].append(step_time(plain, ids))
            times["patched"].append(step_time(patched, ids))
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        rows.append({"model": name, "device": a.device, "backend": a.backend, "batch": a.batch, "seqlen": a.seqlen,
                     **{f"{k}_ms": v for k, v in med.items()},
                     "ratio": med["transformers"] / med["patched"]})
    where = torch.cuda.get_device_name() if a.device.startswith("cuda") else platform.processor() or platform.machine()
    print(f"# {where}, {os.cpu_count()} cores, backend {a.backend}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, torch threads {torch.get_num_threads()}, "
          f"load {os.getloadavg()[0]:.2f}; medians of {a.rounds} interleaved rounds, forward + backward")
    print("| model | batch x seqlen | transformers (ms) | patched (ms) | ratio |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['batch']} x {r['seqlen']} | {r['transformers_ms']:.1f} | {r['patched_ms']:.1f} "
              f"| {r['ratio']:.2f}x |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
