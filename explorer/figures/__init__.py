"""The figures stage: numbers derived from the spec, the ledger and the executed results (per-token costs,
the serving calculator, compare rows and facts), gathered per model for the views."""
