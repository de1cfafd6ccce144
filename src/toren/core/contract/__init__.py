"""The contract: what a run *is*, independent of any store, worker or agent code.

Events and the log format, request digests and their canonical bytes, the pure journal
fold and replay, the value enums, the policies that decide a step (policy.py), the pure
schedule and flow rules, and the ports (protocols) a store implements. Nothing here opens
a connection: where it reads (blobs), it is handed a port. It never imports
toren.core.agent_api or toren.core.drivers (import-linter layers).
"""
