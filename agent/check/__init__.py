"""`istio-cni-agent check` (also `kubectl istio-cni check`): the cluster's checks from an
operator's machine, with the operator's kubeconfig, before install (`--pre`) or after.

Everything is read from the API server; nothing needs a node credential. What the agents say
about themselves comes from what they publish there (see docs/check.md): their pods' status,
the Warning Events they put on the pods they refused, repaired or found with differing rules
and on their own pod when another writer fights over the CNI config, and each agent's /readyz
read through the API server's pod proxy.

    cli          flags, output, exit codes
    cluster      the reads (the kubernetes package: kubeconfig contexts, exec credential plugins)
    result       one check's verdict, as a line and as JSON
    run          runs a list of checks, each failure to read becomes that check's warning
    preinstall   the checks before install       postinstall  ... after install
    agents       the DaemonSet's agents: coverage, versions, readiness, plugin entry
    scheduling   which nodes a DaemonSet's pod should run on, and why not
    published    the agents' Events about pods and their config
    istio        istiod's CNI setting, Istio's own node agent
    platform     Pod Security, GKE's quota, Cilium, the Kubernetes version
"""
