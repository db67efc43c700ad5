"""`rockbot local`: the cluster's YAML on one machine, with no cluster.

The agent runtime, the scripts-manager with its local sandbox, and a small scheduler share one
process and one bus (in memory, or RabbitMQ). Validation and tool resolution are the operator's own
functions, so an Agent offers the same tools here as in a cluster.
"""
