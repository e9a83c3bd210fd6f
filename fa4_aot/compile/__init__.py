"""Building a store: the orchestrator (plan, triage), commits, executors (local pool, Ray farm), the worker
side, lean linking and recipe regions, rebuilding what clients missed, the on-demand builder, coverage
verdicts and time estimates."""
