"""Process harness shared by tests, benchmarks and examples: real servers and processes.

Nothing in ``ledger``, ``tasks``, ``workers`` or ``console`` imports it.
"""
