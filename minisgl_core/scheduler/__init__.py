"""Request state, KV accounting (the page allocator, the prefix cache), batch planning, stop checks: the scheduler plans each step, the runner executes it."""
