"""Fixtures for tests that start real engines: a tiny peaky model built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.models.tiny import build_tiny_model


@pytest.fixture(scope="session")
def tiny_peaky_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-peaky", peaky=True, seed=0)


@pytest.fixture(scope="session")
def tiny_peaky_mtp_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-peaky-mtp", mtp=True, peaky=True, seed=0)


@pytest.fixture(scope="session")
def tiny_peaky_blurred_mtp_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The peaky MTP model's main weights with an MTP layer that misses some successors: drafts get rejected."""
    folder = tmp_path_factory.mktemp("models") / "tiny-peaky-blurred-mtp"
    return build_tiny_model(folder, mtp=True, peaky=True, seed=0, mtp_noise=3.5)
