"""Admission policies (`strategy.policy`): the order in which waiting requests get a place."""

from strategies.policy.fcfs import FCFS
from strategies.policy.prefix_first import PREFIX_FIRST
from strategies.policy.shortest_first import SHORTEST_FIRST
from strategies.registry import Registry

POLICIES = Registry("policy", [FCFS, SHORTEST_FIRST, PREFIX_FIRST])
