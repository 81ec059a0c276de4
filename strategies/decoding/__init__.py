"""Decoding strategies (`strategy.decoding`): what a sequence feeds per step, what is accepted."""

from servelab.strategies.decoding.speculative import SPECULATIVE
from servelab.strategies.decoding.standard import STANDARD
from servelab.strategies.registry import Registry

DECODING = Registry("decoding", [STANDARD, SPECULATIVE])
