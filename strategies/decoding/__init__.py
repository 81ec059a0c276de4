"""Decoding strategies (`strategy.decoding`): what a sequence feeds per step, what is accepted."""

from harness.engine.decoding import Decoder
from strategies.decoding.speculative import SPECULATIVE
from strategies.decoding.standard import STANDARD
from strategies.registry import Registry

DECODING: Registry[Decoder] = Registry("decoding", [STANDARD, SPECULATIVE])
