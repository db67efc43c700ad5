"""ScheduledTasks: cron slots in an IANA zone, fired exactly once into the agent's inbox.

`cron` computes fire instants across daylight-saving transitions, `planning` decides (pure, on an
injected clock) what a task's status must become and which run to trigger, `firing` runs one loop
per task that writes that status before publishing, and `handlers` wires it all into kopf.
"""
