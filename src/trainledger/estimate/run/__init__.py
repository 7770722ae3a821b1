"""The run sections of the ledger: energy, cost, io, checkpoints, host, interconnect."""
