"""Vulkan test helpers shared by the conftests: skip-or-fail without a device, and draining the
validation layer's messages."""

import os

import pytest

REQUIRE_ENV = "SSM_REQUIRE_VULKAN"


def missing(reason: str):
    """Skip a Vulkan test for ``reason``, or fail it when SSM_REQUIRE_VULKAN=1 (CI sets it, so a
    CI image that lost its driver cannot pass by skipping)."""
    if os.environ.get(REQUIRE_ENV, "").strip() == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
    pytest.skip(reason)


def drain(ctx) -> list[str]:
    """The validation messages ``ctx`` collected since the last drain."""
    messages = list(ctx.validation_messages)
    ctx.validation_messages.clear()
    return messages
