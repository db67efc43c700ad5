"""A Kubernetes API server emulator over real HTTP, for tests: kmock's scaffold plus API-server semantics.

What it does as the real server does:
- objects get `uid`, a global monotonically increasing `resourceVersion`, `creationTimestamp`,
  and `generation` (custom resources and the built-ins that have one; bumped only when something
  outside metadata, and status where it is a subresource, changes); `generateName`; create answers
  201; 409 `AlreadyExists`; 404 for a missing namespace; names validated
  (RFC 1123 subdomains; namespaces RFC 1123 labels; Services DNS-1035 labels);
- list and watch with label selectors (`=`, `==`, `!=`, `in`, `notin`, `key`, `!key`) and field
  selectors (`metadata.name`, `metadata.namespace`, a few per kind such as pods' `status.phase`),
  `limit`/`continue`, `kind: XList` with the list's resourceVersion;
- PATCH as merge patch (RFC 7386) or JSON patch (RFC 6902; a failed `test` or a bad path is 422);
  PUT requires `metadata.resourceVersion`; a stale one (PUT or patch) is 409 `Conflict`;
  uid/name/namespace are immutable, creationTimestamp and generation are kept by the server;
  a write that changes nothing makes no new resourceVersion and no event;
- the `status` subresource: main writes keep `.status`, `/status` writes change only `.status`;
- DELETE: at once, with preconditions (uid, resourceVersion); dependents go in the background through
  ownerReferences matched by uid (a dependent keeping another owner only loses the dangling reference);
- WATCH (`watch=true|True|1`, also on one name): "" / "0" / absent resourceVersion sends current
  objects as ADDED, a given one replays the bounded history after it or sends an ERROR event with
  a 410 `Expired` Status when it is older than the history; snapshot and subscription are one
  atomic step, so nothing is lost between list and watch; `timeoutSeconds` ends the stream;
  selectors filter events, and an object leaving (entering) the selection is sent as DELETED (ADDED);
- CRDs are registered for discovery (kinds, plurals, short names, categories, scope, status
  subresource) once the CRD controller (a moment after the write) reports them Established;
  custom resources are pruned and defaulted with `openAPIV3Schema` (not validated: what the server
  refuses is tested on the real one, tests/kube_real);
- built-in defaults that matter to code comparing desired and actual state (Deployment strategy,
  pod template defaults, Service clusterIP/ports, Secret `stringData` folded into `data`...);
- pods as a node serves them: `pods/{name}/binding` (the scheduler's write, once), `pods/{name}/log`
  (from a container the fake kubelet runs, or what `set_pod_log()` set; `limitBytes`, `tailLines`),
  and `pods/{name}/attach` over a WebSocket in the `v5.channel.k8s.io` channel protocol, as the API
  server serves it since 1.30 (404/400 before the upgrade; the opening empty message, stdin, output
  while attached, the final Status on channel 3; `stdinOnce`); a pod's spec is immutable but for
  images, added tolerations and an `activeDeadlineSeconds` that may only be lowered;
- the garbage collector runs a moment after the request that triggers it, as its controller does:
  callers must wait (watch or poll) for dependents to go.

Where it is stricter than a real server (code passing here does not rely on these):
- only merge and JSON patches: strategic-merge and server-side apply answer 415;
- no `dryRun`, no `deletecollection`, no log `follow`, no `sendInitialEvents`, no managedFields,
  no Table output, no protobuf; no BOOKMARK events (a client must not need them); attach
  only over a WebSocket, `v5.channel.k8s.io` (a real server hands older protocols and SPDY to the
  kubelet), no `exec`, `portforward` or `proxy`;
- transition rules (`oldSelf`) under array items are refused at CRD creation rather than
  half-evaluated;
- `fail(code=409)` on a write without a resourceVersion precondition is refused (`EmulatorMisuse`),
  since a real server never answers that; `hang()` holds a request until `end_watches()`;
- a delete with the Foreground or Orphan policy, or of a namespace or a CRD, is refused (400).

Where it is laxer (a real server refuses or rewrites more: check these on a cluster, never rely
on the emulator to catch them):
- CEL rules run only when the schema checks pass, with no cost limits (a real server refuses a
  CRD whose rules may cost too much) and without the Kubernetes CEL library extensions;
- one storage for all versions of a CRD, without conversion;
- finalizers are not honoured: a delete removes the object at once (no client of the emulator sets any);
- built-in objects get only the validation listed in builtins.py, and only some defaults: no
  resource quantity canonicalisation (`"1000m"` stays as written, a server answers `"1"`), no
  dropping of empty fields, no requests defaulted from limits;
- no RBAC, admission webhooks, quotas, or pods that run by themselves: nothing changes a Pod's
  status but a client (the optional `FakeKubelet`, kubelet.py, plays a node over HTTP: it binds,
  runs and reports pods, with the real kubelet's status relist if asked), and Deployments get a
  status only from the optional `DeploymentController` (controllers.py), which plays
  kube-controller-manager over HTTP.
"""

from tests.kubeapi.emulator import KubeApiEmulator

__all__ = ["KubeApiEmulator"]
