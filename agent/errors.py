"""The agent's exceptions, chosen by what the caller does with them.

AgentError
 ├── ConfigError        bad config.yaml or flags: report and exit, never retry
 ├── InstallError       a step of install/uninstall failed on the node's files
 │    └── TransientInstallError   try again later (dir missing, primary config not there yet)
 ├── RedirectError      rules could not be built or applied into a pod's netns
 │    └── InvalidPodInputError    a value the pod controls is refused (names it)
 │         └── InvalidAnnotationError  ... an annotation's
 ├── MeshError          a step of enrolling or releasing an ambient pod failed
 │    ├── NonRetryableAdd         the netns or the rules failed: a new sandbox, not a retry
 │    └── ZtunnelPending          rules in, ztunnel has not taken the pod yet
 └── AmbientLookupError an ambient pod's namespace could not be read
"""


class AgentError(Exception):
    """Base of every error the agent raises on purpose."""


class ConfigError(AgentError):
    """Invalid configuration (file, key, flag): permanent until the operator fixes it."""


class InstallError(AgentError):
    """Installing or removing the plugin's files on the node failed."""


class TransientInstallError(InstallError):
    """A condition that may clear by itself; retry after the next change or interval."""


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


class AmbientLookupError(AgentError):
    """The pod's namespace could not be read and the detection retry demands an answer."""
