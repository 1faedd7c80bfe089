"""The agent's exceptions, by what the caller does with them: one tree, one retry-or-give-up axis.

Every exception the agent raises on purpose is an AgentError. `retry_later` says whether the
same request may succeed later (the API server answers again, ztunnel connects, the namespace
shows up) or never will as it stands (bad input, a bug, rules that do not apply); the pod server
turns that one axis into the CNI error code of a failed ADD (agent.podserver.requests:
FAILURE_REPLY), so no step maps its errors by hand. `+` marks retry later.

AgentError
 ├── ConfigError            bad config.yaml or flags: report and exit, never retry
 │    └── SelectorError     a label selector Kubernetes would refuse (also a ValueError)
 ├── TokenError             a value that is not a valid token of its kind (also a ValueError)
 ├── InstallError           a step of install/uninstall failed on the node's files
 │    └── TransientInstallError +  dir missing, primary config not there yet
 ├── ChangedUnderUs     +   a file changed between our read and our write
 ├── RedirectError          rules could not be built or applied into a pod's netns
 │    └── InvalidPodInputError     a value the pod controls is refused (names it)
 │         └── InvalidAnnotationError  ... an annotation's
 ├── MeshError              a step of enrolling or releasing an ambient pod failed
 │    ├── NonRetryableAdd          the netns or the rules failed: a new sandbox, not a retry
 │    └── ZtunnelPending    +      rules in, ztunnel has not taken the pod yet
 ├── ZtunnelError           +   ztunnel refused or did not acknowledge a workload
 │    └── ZtunnelNotConnected  +  no ztunnel is connected (the pod goes in the next snapshot)
 ├── AmbientLookupError     +   an ambient pod's namespace could not be read
 ├── ApiLookupError         +   a pod or namespace GET kept failing (the caches' lookups)
 ├── KubeApiError           +   a call to the Kubernetes API failed (agent.kube.api)
 │    ├── ApiNotFound           404
 │    ├── ApiForbidden          401/403: the agent's credentials do not allow it
 │    ├── ApiConflict       +   409/422: the object changed: read it again
 │    └── ApiGone           +   410: the watch's version expired: list again
 ├── ResourceExpired        +   a cache's watch must list again (410 Gone)
 ├── WatchError             +   a watch stream reported an error
 │    └── ListVersionExpired +  a watch from the list's own version answered 410
 ├── TaintChanged           +   the node's taints changed between read and patch
 ├── ServerError                the pod server cannot listen on its socket
 ├── ZdsServerError             the ZDS server cannot listen on ztunnel's socket
 └── SocketPathError            a Unix socket cannot be made at its path (also an OSError)

Control flow inside one module stays there, each an AgentError too: the pod server's `Refused`
(a request answered early, agent.podserver.requests), the HTTP server's `FramingError`
(agent.serving.http), the ZDS connection's `ConnectionClosed`, `AckTimeout`, `ProtocolError`
(agent.ambient.zds_conn), and the REST client's `ApiError` (an answer other than 2xx,
agent.kube.rest), which agent.kube.api turns into the KubeApiError of its status, as it does
the throttle's `Throttled` (a call not sent: its turn was further away than its timeout,
agent.kube.throttle).
"""

from __future__ import annotations

import json
from typing import ClassVar


class AgentError(Exception):
    """Base of every error the agent raises on purpose."""

    retry_later: ClassVar[bool] = False
    """The same request may succeed later; False: it will not as things stand (give up)."""


def retry_later(error: BaseException) -> bool:
    """The axis for any exception: an AgentError's own, else give up (a bug stays a failure)."""
    return isinstance(error, AgentError) and error.retry_later


class ConfigError(AgentError):
    """Invalid configuration (file, key, flag): permanent until the operator fixes it."""


class SelectorError(ConfigError, ValueError):
    """A selector Kubernetes would refuse; `path` is relative to the list (`[0].podSelector`)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path, self.message = path, message


class TokenError(AgentError, ValueError):
    """A value refused as a token of its kind; the message says what the kind accepts."""


class InstallError(AgentError):
    """Installing or removing the plugin's files on the node failed."""


class TransientInstallError(InstallError):
    """A condition that may clear by itself; retry after the next change or interval."""

    retry_later = True


class ChangedUnderUs(AgentError):
    """The target changed after we read it: writing now would drop the other writer's change."""

    retry_later = True


class RedirectError(AgentError):
    """Building or applying a pod's redirect rules failed."""


class InvalidPodInputError(RedirectError):
    """A value the pod controls (annotation, label, proxy env or securityContext, pod IP) is
    refused; the message names the input and shows a short escaped excerpt of the value."""


class InvalidAnnotationError(InvalidPodInputError):
    """A pod annotation holds a value the agent refuses (message names annotation and value)."""


class MeshError(AgentError):
    """A step of enrolling or releasing a pod failed; the message names the step and the pod."""


class NonRetryableAdd(MeshError):
    """Istio's ErrNonRetryableAdd: the netns or the rules failed; retrying the same add is
    pointless (the CNI ADD fails, the runtime makes a new sandbox)."""


class ZtunnelPending(MeshError):
    """Rules are in, ztunnel did not take the pod (away or refused): annotated `pending`."""

    retry_later = True


class ZtunnelError(AgentError):
    """ztunnel refused or did not acknowledge a workload."""

    retry_later = True


class ZtunnelNotConnected(ZtunnelError):
    """No ztunnel is connected; the pod will be sent in the next snapshot."""


class AmbientLookupError(AgentError):
    """The pod's namespace could not be read and the detection retry demands an answer."""

    retry_later = True


class ApiLookupError(AgentError):
    """The API server did not answer a pod or namespace lookup; try again later."""

    retry_later = True


class KubeApiError(AgentError):
    """A call to the Kubernetes API did not get the answer asked for; try again later.
    `answered`: the API server answered, with HTTP `status` and its `reason` phrase (else there
    was no answer: connection refused, timeout, not JSON); `cause` is the client's exception."""

    retry_later = True

    def __init__(
        self,
        cause: BaseException,
        status: int | None = None,
        reason: object = None,
        *,
        answered: bool = False,
    ) -> None:
        self.cause, self.status, self.reason, self.answered = cause, status, reason, answered
        super().__init__(f"API server answered {status} {reason}" if answered else str(cause))

    @property
    def message(self) -> str:
        """The API server's own message (its Status object's), else the reason; ≤300 chars."""
        body = getattr(self.cause, "body", None)
        try:
            found = json.loads(body or "{}").get("message")
        except (ValueError, AttributeError):
            found = None
        return str(found or self.reason)[:300]


class ApiNotFound(KubeApiError):
    """404: the object does not exist."""

    retry_later = False


class ApiForbidden(KubeApiError):
    """401/403: the agent's credentials do not allow the call; retrying does not help."""

    retry_later = False


class ApiConflict(KubeApiError):
    """409/422: the object changed since it was read (a precondition failed)."""


class ApiGone(KubeApiError):
    """410: the resourceVersion a watch started from is too old."""


class ResourceExpired(AgentError):
    """The watch's resourceVersion is too old for the server (410 Gone): list again."""

    retry_later = True


class WatchError(AgentError):
    """The watch stream reported an error other than an expired version."""

    retry_later = True


class ListVersionExpired(WatchError):
    """A watch from the version a list returned moments before answered 410: listing at once
    again would meet the same (a server or proxy answering every resume so), so it is a
    failure, backed off."""


class TaintChanged(AgentError):
    """The node's taints changed between our read and our patch."""

    retry_later = True


class ServerError(AgentError):
    """The pod server could not listen on its socket (message names the path)."""


class ZdsServerError(AgentError):
    """The ZDS server could not listen on its socket (message names the path)."""


class SocketPathError(AgentError, OSError):
    """The socket cannot be created at its path; the message names the socket and why."""
