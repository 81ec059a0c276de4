"""The strategy presets against the option configs, the one source of every option default."""

from __future__ import annotations

from servelab.strategies.preset import BASE_PRESET, option_keys_block, with_block
from servelab.strategies.settings import REGISTRIES


def test_the_base_preset_lists_every_option_key_as_the_configs_give_it() -> None:
    """Stale after an option config changed? Run `python -m servelab.strategies.preset`."""
    text = BASE_PRESET.read_text()
    assert with_block(text) == text


def test_the_generated_block_holds_each_key_once_with_its_default() -> None:
    block = option_keys_block()
    keys = [line.split(":")[0] for line in block.splitlines() if not line.startswith("#")]
    assert len(keys) == len(set(keys))
    assert "prefix_caching: true" in block and "gamma_rule: fixed" in block
    assert {r.axis for r in REGISTRIES}.isdisjoint(keys)  # axis names are the preset's own
