"""Every property of ssm_ref.testing.properties, on every backend of the registry (ssm_ref float32,
ssm_fast, ssm_vk on lavapipe), over drawn problems in every value regime the property is
claimed for. A property that does not apply to a drawn case (its check returns False) makes
hypothesis draw another."""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from registry import BACKENDS

from ssm_ref.testing.properties import PROPERTIES
from ssm_ref.testing.strategies import problems

# Regimes drawn for each property (default: every regime it is claimed for). The non-finite
# pattern holds trivially where everything is finite, so its examples go where inf/nan appear.
DRAWN = {"nonfinite_pattern": ("overflow", "nonfinite")}

# Small enough that lavapipe under the validation layer keeps the suite to minutes.
# long_decay: T in 20..80, past ssm_vk's checkpoint interval of the backward (8 or 16 tokens).
SIZES = dict(max_elements=1500, max_S=3, max_T=6, max_T_long=80, max_G=2, max_H_per_G=4, max_P=3, max_N=6)
# Wide rows: P in 33..48 with N >= 8 splits a head's channels over several workgroups of ssm_vk
# on an 8-lane subgroup (lavapipe) with workgroups of up to 256 threads: the channel-block
# reductions run only there.
WIDE = dict(max_elements=12_000, max_S=2, max_T=4, max_T_long=20, max_G=2, max_H_per_G=2, min_P=33, max_P=48,
            min_N=8, max_N=12)


@pytest.mark.parametrize("name", list(PROPERTIES))
@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@given(data=st.data())
@settings(max_examples=2 * settings().max_examples)   # ci: 50 per (backend, property), about 30 s in all
def test_property_holds(backend, name, data):
    prop = PROPERTIES[name]
    case = data.draw(problems(regimes=DRAWN.get(name, prop.regimes), **SIZES), label="case")
    assume(prop.check(backend.module, case, backend.tol))


@pytest.mark.parametrize("name", list(PROPERTIES))
@pytest.mark.parametrize("backend", BACKENDS, ids=repr)
@given(data=st.data())
@settings(max_examples=max(5, settings().max_examples // 2))
def test_property_holds_on_wide_rows(backend, name, data):
    prop = PROPERTIES[name]
    case = data.draw(problems(regimes=DRAWN.get(name, prop.regimes), **WIDE), label="case")
    assume(prop.check(backend.module, case, backend.tol))
