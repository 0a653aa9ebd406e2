"""Recording the chunked Mamba-3 forward (ws.plan: an M3ChunkPlan; glsl/m3c_*.comp).

In order, a barrier between each: the non-finite flag zeroed; where F > 0 the chunks' angle sums
(m3c_prep MODE 0) and the pass over them (m3c_angle: each chunk's θ_in, the final θ); the
rotated keys and queries and the chunks' decays (m3c_prep MODE 1); each chunk's own state
contribution (m3c_states); the pass over the chunks (m3c_pass: the state each chunk receives,
the final h, k, v); y (m3c_y); the flag copied where the host reads it after the wait
(ssm_vk.mamba3_run recomputes a flagged call on the token-sequential kernels).

``ws``: the call's workspace (ssm_vk.mamba3_workspace.M3Workspace): ``ctx``, ``plan``,
``bind(name)`` and ``flag_host()``.
``p``: the checked problem (ssm_ref.mamba3_checks.M3Problem).
"""

from __future__ import annotations

from ..kernel_specs import pack_push
from ..recording import flag_end, kernel
from . import mamba3_chunked_specs as m3c

__all__ = ["record_forward", "record_backward", "FLAG"]

FLAG = "m3c_flag"   # the scratch the kernels raise on a non-finite value (4 uint32, the first read)


def _push(p, plan, gx: int, mode: int = 0) -> bytes:
    d = p.dims
    return pack_push(m3c.PUSH, dict(S=d.S, T=d.T, H=d.H, P=d.P, G=d.G, F=d.F, R=d.R, N=d.N, M=d.M, L=plan.L,
                                    NC=plan.NC, halved=int(p.rotation == "halved"), gx=gx, mode=mode))


def record_forward(seq, ws, p, bufs: dict, scatter: bool = False) -> None:
    """Record the chunked forward (``bufs``: unused, the workspace binds by name; ``scatter``:
    never -- the final states go to their own arrays, the caller writes the cache rows)."""
    plan = ws.plan
    binds = [ws.bind(k) for k in m3c.BINDINGS]
    flag = ws.bind(FLAG)
    seq.fill(flag[0], 0, 0, flag[2])

    def run(spec, grid, mode: int = 0) -> None:
        seq.barrier()
        seq.dispatch(kernel(ws.ctx, spec), binds, _push(p, plan, grid[0], mode), (grid[0], grid[1], 1))

    if p.dims.F:
        run(m3c.prep_spec(), plan.prep, 0)
        run(m3c.angle_spec(), plan.angle)
    run(m3c.prep_spec(), plan.prep, 1)
    run(m3c.states_spec(), plan.states)
    run(m3c.pass_spec(), plan.pass_)
    run(m3c.y_spec(), plan.y)
    flag_end(seq, ws, flag[0])   # (the workspace reads it after the wait: a flagged call is computed again)


def record_backward(seq, ws, p, bufs: dict, kept=None) -> None:
    raise AssertionError("the chunked Mamba-3 kernels have no backward: its planner never takes one")
