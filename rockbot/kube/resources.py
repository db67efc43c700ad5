"""The API resources rockbot touches, and how their URLs are built."""

from dataclasses import dataclass
from urllib.parse import quote

GROUP = "rockbot.dev"
VERSION = "v1alpha1"


@dataclass(frozen=True, kw_only=True)
class Resource:
    """One kind of object the API serves: where it lives (group/version/plural) and what it is called."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        """The `apiVersion` field of objects of this resource (`v1`, `apps/v1`, ...)."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, *, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        """The URL path of the collection, of one object, or of one object's subresource.

        A namespaced resource without a namespace addresses all namespaces (list and watch only).
        """
        if namespace is not None and not self.namespaced:
            raise ValueError(f"{self.kind} is cluster-scoped: pass no namespace")
        if subresource is not None and name is None:
            raise ValueError(f"the {subresource!r} subresource needs an object name")
        parts = ["/apis", self.group, self.version] if self.group else ["/api", self.version]
        if namespace is not None:
            parts += ["namespaces", quote(namespace, safe="")]
        parts.append(self.plural)
        if name is not None:
            parts.append(quote(name, safe=""))
        if subresource is not None:
            parts.append(subresource)
        return "/".join(parts)


NAMESPACES = Resource(group="", version="v1", plural="namespaces", kind="Namespace", namespaced=False)
PODS = Resource(group="", version="v1", plural="pods", kind="Pod")
CONFIGMAPS = Resource(group="", version="v1", plural="configmaps", kind="ConfigMap")
SECRETS = Resource(group="", version="v1", plural="secrets", kind="Secret")
SERVICEACCOUNTS = Resource(group="", version="v1", plural="serviceaccounts", kind="ServiceAccount")
SERVICES = Resource(group="", version="v1", plural="services", kind="Service")
EVENTS = Resource(group="", version="v1", plural="events", kind="Event")
DEPLOYMENTS = Resource(group="apps", version="v1", plural="deployments", kind="Deployment")
LEASES = Resource(group="coordination.k8s.io", version="v1", plural="leases", kind="Lease")
NETWORKPOLICIES = Resource(group="networking.k8s.io", version="v1", plural="networkpolicies", kind="NetworkPolicy")
CRDS = Resource(
    group="apiextensions.k8s.io",
    version="v1",
    plural="customresourcedefinitions",
    kind="CustomResourceDefinition",
    namespaced=False,
)

AGENTS = Resource(group=GROUP, version=VERSION, plural="agents", kind="Agent")
TOOLS = Resource(group=GROUP, version=VERSION, plural="tools", kind="Tool")
SCHEDULED_TASKS = Resource(group=GROUP, version=VERSION, plural="scheduledtasks", kind="ScheduledTask")
EVALUATIONS = Resource(group=GROUP, version=VERSION, plural="evaluations", kind="Evaluation")
TRIGGERS = Resource(group=GROUP, version=VERSION, plural="triggers", kind="Trigger")
TOKEN_REVIEWS = Resource(group="authentication.k8s.io", version="v1", plural="tokenreviews", kind="TokenReview",
                         namespaced=False)
SUBJECT_ACCESS_REVIEWS = Resource(group="authorization.k8s.io", version="v1", plural="subjectaccessreviews",
                                  kind="SubjectAccessReview", namespaced=False)
