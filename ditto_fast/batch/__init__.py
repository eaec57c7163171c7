"""`ditto-fast batch`: jobs (a render request each) checked all first, rendered by one engine here (`local`) or
by one engine per Ray actor (`ray_actors`), with a report of every job's outcome."""
