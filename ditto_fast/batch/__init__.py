"""`ditto-fast batch`: jobs (a render request each) read and checked all first (`jobs`), then run by one runner
(`runner`: skip finished, fail-fast, the report) on one engine here (`local`) or one engine per Ray actor
(`ray_actors`); `launch` is the command's whole batch."""
