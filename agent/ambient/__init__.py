"""Ambient mode: which pods are in the mesh, and bringing them in and out of it.

enrollment: Istio's decisions about a pod, as pure functions (label selectors are
agent.label_selectors); enroller: a CNI ADD/DEL's ambient side, for the pod server; mesh: the
dataplane that drives the three parts in Istio's order (reconcile: its start-up half and the
pod record; dataplane: their contract; the in-pod
and node rules are agent.rules.ambient; zds, zds_conn, zds_pb2: the ZDS server that hands pods
to ztunnel; annotator: the redirection annotation it writes); watch: pod and namespace events,
through workqueue (one pending item per pod); service: the lifecycle service and the parts
it is built from.
"""
