"""Admission policies (`strategy.policy`): the order in which waiting requests get a place."""

from servelab.strategies.policy.fcfs import FCFS
from servelab.strategies.policy.prefix_first import PREFIX_FIRST
from servelab.strategies.policy.shortest_first import SHORTEST_FIRST
from servelab.strategies.registry import Registry

POLICIES = Registry("policy", [FCFS, SHORTEST_FIRST, PREFIX_FIRST])
