"""Efficiency catalog fields written once and shared by other families (``shared_from``)."""

from __future__ import annotations

import shutil

import pytest

from trainledger.errors import CatalogError
from trainledger.estimate.time import efficiency as E


@pytest.fixture
def catalog(tmp_path, monkeypatch):
    d = tmp_path / "efficiency"
    shutil.copytree(E._dir(), d)
    monkeypatch.setattr(E, "_dir", lambda: d)
    E._families.cache_clear()
    yield d
    E._families.cache_clear()


def _family(name):
    return next(e for f, e, _ in E._families() if f == name)


def test_families_take_the_head_dim_constant_from_the_file_that_derives_it(catalog):
    ampere = catalog / "ampere.yaml"
    text = ampere.read_text()
    assert "attention_half_head_dim: 16" in text
    ampere.write_text(text.replace("attention_half_head_dim: 16", "attention_half_head_dim: 24"))
    for fam in ("ampere", "hopper", "blackwell", "volta", "ada", "cdna", "default"):
        assert _family(fam).attention_half_head_dim == 24.0, fam


def test_a_field_both_set_and_shared_is_refused(catalog):
    hopper = catalog / "hopper.yaml"
    hopper.write_text(hopper.read_text() + "attention_half_head_dim: 20\n")
    with pytest.raises(CatalogError, match="both set here and shared from ampere.yaml"):
        E._families()


def test_sharing_from_a_missing_family_is_refused(catalog):
    hopper = catalog / "hopper.yaml"
    hopper.write_text(hopper.read_text().replace("shared_from: {ampere:", "shared_from: {pascal:"))
    with pytest.raises(CatalogError, match="names 'pascal'"):
        E._families()
