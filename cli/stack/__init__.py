"""The development stack: the Procfile's processes started as production starts them
(:mod:`cli.stack.processes`) and embedded Postgres and Redis (:mod:`cli.stack.embedded`), for
``ibex up``, ``ibex demo``, the benchmarks and the tests that run real processes."""
