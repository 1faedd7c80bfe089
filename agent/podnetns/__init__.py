"""Which network namespace on the node belongs to which pod, by the runtime's identity.

A pod's IP is no identity: any pod that can add an address (NET_ADMIN, or a CNI that lets pods
spoof) can make its own namespace hold a neighbour's IP. The namespace of a pod is what the
runtime said at CNI ADD (`record.py`: CNI_NETNS for K8S_POD_UID), or, for pods the agent did not
see start, the namespace of the processes whose cgroup names the pod's UID (`cgroup.py`,
`scan.py`, as Istio's node agent finds it), checked to hold one of the pod's IPs. Two namespaces
holding one pod IP are reported and counted, never settled by choosing one (`finder.py`).
"""
