"""The agent's API: what agent code calls. ``ctx`` (context.py), the program and its
registry (program.py), branches and combinators. It sits on the contract and is driven by
toren.core.drivers; it never imports a driver (import-linter layers).
"""
