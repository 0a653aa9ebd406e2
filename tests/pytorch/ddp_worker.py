"""Training runs for tests/pytorch/test_ddp.py: a tiny Mamba-2 language model (transformers'
Mamba2ForCausalLM, random weights, patched with ssm_torch.hf) trained for a few SGD steps on one
fixed global batch, either in one process or data-parallel over 2 CPU processes (gloo,
DistributedDataParallel, rendezvous through a file: no network but the loopback gloo uses).

    python ddp_worker.py single OUT.pt
    python ddp_worker.py ddp OUT.pt

OUT.pt holds {"losses": [global mean loss per step], "params": {name: tensor}} (and for the
single run "init", the parameters before training).
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch
import torch.distributed as dist

STEPS, WORLD, GLOBAL_BATCH, SEQ, VOCAB, LR = 10, 2, 4, 12, 40, 0.5


def build():
    import transformers

    import ssm_torch.hf

    torch.manual_seed(0)
    cfg = transformers.Mamba2Config(vocab_size=VOCAB, hidden_size=16, num_heads=4, head_dim=8, n_groups=2,
                                    state_size=8, chunk_size=4, num_hidden_layers=2, expand=2, conv_kernel=3,
                                    time_step_min=0.2, time_step_max=1.0)
    model = transformers.Mamba2ForCausalLM(cfg)
    return ssm_torch.hf.patch(model, backend="ssm_ref").train()


def batch():
    return torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ), generator=torch.Generator().manual_seed(1))


def single(out: str) -> None:
    model, ids = build(), batch()
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = model(ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        losses.append(float(loss))
    torch.save({"losses": losses, "params": {n: p.detach().clone() for n, p in model.named_parameters()},
                "init": init}, out)


def _rank(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        model = torch.nn.parallel.DistributedDataParallel(build())
        ids = batch().chunk(WORLD)[rank]          # this rank's half of the global batch
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        losses = []
        for _ in range(STEPS):
            opt.zero_grad()
            loss = model(ids, labels=ids, use_cache=False).loss   # the mean over this rank's tokens
            loss.backward()                                       # DDP averages the gradients
            opt.step()
            total = loss.detach().clone()
            dist.all_reduce(total)
            losses.append(float(total) / WORLD)                   # equal token counts: the global mean
        if rank == 0:
            params = {n.removeprefix("module."): p.detach().clone() for n, p in model.named_parameters()}
            torch.save({"losses": losses, "params": params}, out)
    finally:
        dist.destroy_process_group()


def ddp(out: str) -> None:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(os.path.join(tmp, "store"), out), nprocs=WORLD, join=True)


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    {"single": single, "ddp": ddp}[mode](out)
