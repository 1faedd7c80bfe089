"""Repair: pods on this node that started before the plugin could redirect them.

detect.py decides which pods are broken (pure), actions.py repairs, deletes or labels,
service.py runs the loop; a pod's network namespace is found by agent.podnetns.
"""
