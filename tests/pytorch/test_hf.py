"""ssm_torch.hf.patch on transformers' MambaForCausalLM and Mamba2ForCausalLM, tiny random
configurations (nothing downloaded): logits, every parameter's gradient and greedy generation with
the state cache equal transformers' own PyTorch path within float32 tolerance; the patched path
really runs (ssm_torch.last_where); unpatched models are untouched. Skipped without transformers,
failed instead under SSM_REQUIRE_TORCH=1."""

import pytest
from torchreq import need, need_torch

torch = need_torch()
transformers = need("transformers", "pip install transformers")

import ssm_torch  # noqa: E402
from ssm_torch import _common, hf  # noqa: E402

VOCAB = 48


def mamba1():
    cfg = transformers.MambaConfig(vocab_size=VOCAB, hidden_size=16, state_size=4, num_hidden_layers=2, expand=2,
                                   conv_kernel=3, time_step_rank=4, time_step_min=0.2, time_step_max=1.0)
    return transformers.MambaForCausalLM(cfg)


def mamba2():
    cfg = transformers.Mamba2Config(vocab_size=VOCAB, hidden_size=16, num_heads=4, head_dim=8, n_groups=2,
                                    state_size=8, chunk_size=4, num_hidden_layers=2, expand=2, conv_kernel=3,
                                    time_step_min=0.2, time_step_max=1.0)
    return transformers.Mamba2ForCausalLM(cfg)


def randomize(model, seed):
    """Weights away from their initial values (D and A spread out, so the scan matters)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model


def rel(a, b):
    return float((a - b).norm() / b.norm())


def loss_and_grads(model, ids):
    model.zero_grad()
    out = model(ids, labels=ids, use_cache=False)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("backend", ["ssm_ref", "ssm_vk"])
@pytest.mark.parametrize("build", [mamba1, mamba2], ids=["mamba1", "mamba2"])
def test_logits_and_gradients_equal_transformers_own_path(build, backend):
    torch.manual_seed(0)
    model = randomize(build(), 1).train()
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(2))
    want_logits, want = loss_and_grads(model, ids)
    hf.patch(model, backend=backend)
    assert hf.patched(model)
    _common._LAST.value = None
    got_logits, got = loss_and_grads(model, ids)
    w = ssm_torch.last_where()
    assert w is not None and w.op == "ssm_scan_back" and w.backend == backend, w
    assert rel(got_logits, want_logits) < 1e-5
    assert got.keys() == want.keys() and len(got) > 10
    for name in want:
        assert rel(got[name], want[name]) < 1e-4, name
    hf.unpatch(model)
    assert not hf.patched(model)
    _common._LAST.value = None
    again, _ = loss_and_grads(model, ids)
    assert ssm_torch.last_where() is None and torch.equal(again, want_logits)


@pytest.mark.parametrize("build", [mamba1, mamba2], ids=["mamba1", "mamba2"])
def test_greedy_generation_with_the_state_cache(build):
    torch.manual_seed(0)
    model = randomize(build(), 3).eval()
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(4))
    kw = dict(max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True,
              attention_mask=torch.ones_like(prompt), pad_token_id=0)
    want = model.generate(prompt, **kw)
    hf.patch(model)
    _common._LAST.value = None
    got = model.generate(prompt, **kw)
    assert ssm_torch.last_where() is not None   # the decoding steps ran on ssm-scan
    assert torch.equal(got.sequences, want.sequences)
    for a, b in zip(got.scores, want.scores, strict=True):
        assert rel(a, b) < 1e-5


def test_an_unpatched_model_beside_a_patched_one_is_untouched():
    torch.manual_seed(0)
    patched_model, plain = randomize(mamba2(), 5).eval(), randomize(mamba2(), 5).eval()
    hf.patch(patched_model)
    ids = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(6))
    _common._LAST.value = None
    with torch.no_grad():
        plain(ids, use_cache=False)
    assert ssm_torch.last_where() is None
    with torch.no_grad():
        patched_model(ids, use_cache=False)
    assert ssm_torch.last_where() is not None


def test_patch_needs_a_mamba_model():
    with pytest.raises(ValueError, match=r"^model: no transformers MambaMixer or Mamba2Mixer in Linear$"):
        hf.patch(torch.nn.Linear(2, 2))
