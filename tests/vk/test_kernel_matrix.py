"""The packaged SPIR-V matrix (ssm_vk.registry.matrix, what ``ssm-scan build-shaders`` puts into a
wheel) holds every token-sequential kernel a plan dispatches, for the d_state values it was built
for: a wheel without glslc must run every such shape on the GPU, not refuse it. Pure Python: the
plans of many shapes on the H200's and lavapipe's limits against the matrix's specs."""

from __future__ import annotations

import itertools

import plans
import pytest

from ssm_ref import Dims
from ssm_vk import config, registry
from ssm_vk.chunked.chunked_specs import chunk_kernels
from ssm_vk.m1.m1_specs import M1_PACKAGED_N, m1_kernels
from ssm_vk.sizing import Limits

OPS = frozenset({"basic", "vote", "arithmetic", "ballot", "shuffle", "shuffle_relative", "clustered", "quad"})
PROFILES = {
    "h200": Limits(subgroup_size=32, subgroup_ops=OPS, max_workgroup_invocations=1024, max_shared_memory=48 << 10,
                   max_workgroup_count=(2**31 - 1, 65535, 65535), max_storage_buffer_range=2**32 - 1,
                   max_memory_allocation_size=2**32, min_storage_buffer_offset_alignment=16,
                   max_workgroup_size=(1024, 1024, 64), device_type="discrete"),
    "lavapipe": Limits(subgroup_size=8, subgroup_ops=OPS - {"clustered"}, max_workgroup_invocations=1024,
                       max_shared_memory=32 << 10, max_workgroup_count=(65535, 65535, 65535),
                       max_storage_buffer_range=2**27, max_memory_allocation_size=2**31,
                       min_storage_buffer_offset_alignment=16, device_type="cpu"),
}
N_VALUES = [1, 5, 16, 64, 128]


# The calls' modes (docs/SPEC.md sections 3.1, 3.2), as (invariant, K): the default; K > 1 state
# snapshots (the forward with SNAP, the backward given g_snapshots); the invariant mode (EXACT);
# both at once.
CALL_MODES = {"default": (False, 1), "snapshots": (False, 3), "invariant": (True, 1),
              "invariant+snapshots": (True, 4)}


@pytest.mark.parametrize("mode", CALL_MODES)
@pytest.mark.parametrize("device", PROFILES)
def test_every_sequential_kernel_a_plan_dispatches_is_packaged(device, mode):
    lim = PROFILES[device]
    invariant, K = CALL_MODES[mode]
    knobs = config.invariant_mode(config.DEFAULTS, invariant)
    packaged = {(name, tuple(sorted(d.items()))) for name, d in registry.matrix([lim], N_VALUES,
                                                                                knobs=config.DEFAULTS)}
    seen, names = 0, set()
    shapes = itertools.product((1, 3), (1, 2, 64, 2048), ((8, 1, 1), (1536, 1, 1), (20, 1, 1), (2, 4, 1),
                                                          (24, 64, 1), (12, 8, 4), (6, 3, 2)),
                               N_VALUES, (False, True), (False, True))
    for S, T, (H, P, G), N, mamba1, backward in shapes:
        d = Dims(S=S, T=T, H=H, P=P, N=N, G=G, R=S, mamba1=mamba1, a_shape=(H, N) if mamba1 else (H,), K=K)
        pl = registry.plan(d, lim, backward, knobs, snap=K > 1)
        for spec in registry.kernels_needed(d, pl, backward):
            if spec.name.startswith("chunk_"):
                continue     # the chunked kernels' matrix is per (P, N): built for the P values asked
            if spec.name.startswith("m1_") and N not in M1_PACKAGED_N:
                continue     # Mamba-1's time-in-threads kernels: N = 16 only (the others fall back; test_m1_vk)
            if mode != "default" and N not in registry.MODES_N:
                continue     # the modes' variants: the d_state of Mamba models only (test below)
            key = (spec.name, tuple(sorted((k, int(v)) for k, v in spec.defines)))
            assert key in packaged, (device, mode, d, backward, spec)
            seen += 1
            names.add((spec.name, *(k for k in ("SNAP", "EXACT", "SEQSUM") if dict(spec.defines).get(k))))
    assert seen > 500
    # what the mode's plans ask for: SNAP forward and backward with K > 1 (a decode step of K > 1
    # on the ordinary kernel, never the decode kernel), EXACT throughout in the invariant mode
    # with the per-sequence sum of d_A, the decode kernel in no mode but the default
    exact = ("EXACT",) if invariant else ()
    want = {("ssm_scan", "SNAP", *exact), ("ssm_scan", *exact), ("ssm_scan_back", "SNAP", *exact)} if K > 1 else \
        {("ssm_scan", *exact), ("ssm_scan_back", *exact)}
    if invariant:
        want.add(("ssm_scan_reduce", "SEQSUM"))
    assert want <= names, want - names
    assert any("SNAP" in n for n in names) == (K > 1)
    assert any("EXACT" in n for n in names) == invariant
    assert all("EXACT" in n for n in names if n[0] in ("ssm_scan", "ssm_scan_back")) == invariant
    assert mode == "default" or not any(n[0] == "ssm_decode" for n in names)


def test_the_modes_variants_are_packaged_for_the_d_state_of_mamba_models_only():
    # the SNAP / EXACT / SEQSUM variants of the matrix over every N are those the modes' plans ask
    # for at N in MODES_N (fewer than at every N: the others compile with glslc or fall back)
    lim = PROFILES["h200"]

    def own(specs):
        return {(n, tuple(sorted(dict(d).items()))) for n, d in specs
                if any(k in dict(d) for k in ("SNAP", "EXACT", "SEQSUM"))}

    full = own(registry.matrix([lim], list(range(1, 257)), knobs=config.DEFAULTS))
    at = own((sp.name, sp.defines) for sp in registry.modes_matrix(lim, registry.MODES_N, config.DEFAULTS))
    every = own((sp.name, sp.defines) for sp in registry.modes_matrix(lim, range(1, 257), config.DEFAULTS))
    assert full == at and len(at) < len(every), (len(full), len(at), len(every))


def test_the_modes_add_only_their_own_variants_after_the_defaults():
    # the snapshots' and the invariant mode's variants (SNAP, EXACT, the per-sequence sum of d_A)
    # come after the default's, whose defines and order they leave as they were: every other
    # kernel their plans ask for is one of the default's already
    for lim in PROFILES.values():
        full = registry.matrix([lim], N_VALUES, knobs=config.DEFAULTS)
        own = [any(k in d for k in ("SNAP", "EXACT", "SEQSUM")) for _, d in full]
        first = own.index(True)
        assert not any(own[:first]) and all(own[first:])


def test_the_mamba1_kernels_with_time_in_threads_are_packaged_for_n16():
    lim = PROFILES["h200"]
    packaged = {(name, tuple(sorted(d.items()))) for name, d in registry.matrix([lim], N_VALUES,
                                                                                knobs=config.DEFAULTS)}
    seen = set()
    for S, T, H, backward in itertools.product((1, 8), (2, 64, 512, 2048, 16384), (1536, 5120), (False, True)):
        d = Dims(S=S, T=T, H=H, P=1, N=16, G=1, R=S, mamba1=True, a_shape=(H, 16))
        pl = registry.plan(d, lim, backward, config.DEFAULTS)
        assert plans.of(pl, "m1") is not None
        for spec in registry.kernels_needed(d, pl, backward):
            key = (spec.name, tuple(sorted((k, int(v)) for k, v in spec.defines)))
            assert key in packaged, (d, backward, spec)
            seen.add(spec.name)
    assert {"m1_scan", "m1_scan_back", "ssm_scan_carry"} <= seen


def test_a_wheel_holds_the_time_in_threads_kernels_an_h200_plans():
    # what `make dist` packages (ssm-scan build-shaders --subgroup-sizes 8,16,32,64) against the
    # plans of the H200's own limits: a wheel without glslc runs Mamba-1 there on these kernels
    from ssm_cli.build import profiles, variants

    wheel = {(name, tuple(sorted(d.items()))) for name, d in variants([lim for _, lim in profiles("8,16,32,64")], [16])}
    # (T = 512 with one sequence: the forward's subgroups take two slices each)
    for S, T, H, backward in itertools.product((1, 8), (64, 512, 2048, 16384), (1536, 5120), (False, True)):
        d = Dims(S=S, T=T, H=H, P=1, N=16, G=1, R=S, mamba1=True, a_shape=(H, 16))
        pl = registry.plan(d, PROFILES["h200"], backward, config.DEFAULTS)
        for spec in m1_kernels(d, plans.of(pl, "m1"), backward):
            assert (spec.name, tuple(sorted((k, int(v)) for k, v in spec.defines))) in wheel, (d, backward, spec)


def test_every_chunked_kernel_a_plan_dispatches_is_packaged_for_its_p_and_n():
    # the chunked kernels (a GPU's: a CPU device keeps the token-sequential ones) for the (P, N) a
    # wheel is built for: one head per group or several (the d_B / d_C products over the chunk's
    # own tokens then once per group), per head or per group
    device, lim = "h200", PROFILES["h200"]
    packaged = {(name, tuple(sorted(d.items()))) for name, d in registry.matrix([lim], [16, 128], (16, 64), [16, 128],
                                                                                knobs=config.DEFAULTS)}
    seen, folds = 0, set()
    for (S, T), (H, G), (P, N), backward in itertools.product(((1, 256), (8, 2048), (1, 16384)),
                                                              ((24, 1), (8, 8), (12, 4)), ((64, 128), (16, 16)),
                                                              (False, True)):
        d = Dims(S=S, T=T, H=H, P=P, N=N, G=G, R=S, mamba1=False, a_shape=(H,))
        pl = registry.plan(d, lim, backward, config.DEFAULTS)
        cp = plans.of(pl, "chunked")
        if cp is None:
            continue
        folds.add((cp.fold, cp.headloop) if backward else None)
        for spec in chunk_kernels(d, cp, backward):
            key = (spec.name, tuple(sorted((k, int(v)) for k, v in spec.defines)))
            assert key in packaged, (device, d, backward, spec)
            seen += 1
    assert seen > 100 and {(True, False), (False, False)} <= folds, folds
