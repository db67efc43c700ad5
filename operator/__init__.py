"""The kopf operator: reconciles Agents, Tools and ScheduledTasks into Kubernetes objects."""
