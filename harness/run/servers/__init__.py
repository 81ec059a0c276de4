"""Servers a run starts itself for the `openai` backend (`server=NAME`): their settings, their
command lines, the preset and the KV budget as each engine's switches, and their lifetime."""
