"""Executors run one `Action` and return an `ActionResult`; they never decide what to run."""
