"""The drivers: the code that moves runs forward against a store. The tick and its
parts (tickstate, steps, writer, parker, waits, aborts, effects), the worker and its
fencing and takeover, upkeep and the scheduler, run starts (runs.py), fix-forward, plan and
verify. They use the agent's API and the contract; nothing below imports them.
"""
