"""Is this node ready for a pod's CNI ADD? Each prerequisite is a named check (checks.py,
netns_dir.py, scratch.py), run by one service (service.py) whose results /readyz, the node taint
and the metric istio_cni_ready_check{check} read."""
