"""verify tests: a package so their basenames (test_comm, test_io) do not clash with tests/unit."""
