"""The custom resources of group `rockbot.dev`: pydantic models are the single source of truth.

`rockbot crds` turns them into the CustomResourceDefinitions in `crds/` (see `rockbot.crdgen`).
"""

from rockbot.resources.agent import Agent, AgentSpec, AgentStatus
from rockbot.resources.checking import validate
from rockbot.resources.common import GROUP, VERSION, Condition
from rockbot.resources.evaluation import Evaluation, EvaluationSpec, EvaluationStatus
from rockbot.resources.scheduledtask import ScheduledTask, ScheduledTaskSpec, ScheduledTaskStatus
from rockbot.resources.tool import Tool, ToolSpec, ToolStatus
from rockbot.resources.trigger import Trigger, TriggerSpec, TriggerStatus

__all__ = [
    "GROUP",
    "VERSION",
    "Agent",
    "AgentSpec",
    "AgentStatus",
    "Condition",
    "Evaluation",
    "EvaluationSpec",
    "EvaluationStatus",
    "ScheduledTask",
    "ScheduledTaskSpec",
    "ScheduledTaskStatus",
    "Tool",
    "ToolSpec",
    "ToolStatus",
    "Trigger",
    "TriggerSpec",
    "TriggerStatus",
    "validate",
]
