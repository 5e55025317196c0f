"""Real loopback stand-ins for the outside world, used by tests, `context-gateway demo` and benchmarks."""
