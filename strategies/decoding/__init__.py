"""Decoding strategies (`strategy.decoding`): what a sequence feeds per step, what is accepted."""

from strategies.decoding.speculative import SPECULATIVE
from strategies.decoding.standard import STANDARD
from strategies.registry import Registry

DECODING = Registry("decoding", [STANDARD, SPECULATIVE])
