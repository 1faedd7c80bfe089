"""Repair: pods on this node that started before the plugin could redirect them.

detect.py decides which pods are broken (pure), netns_finder.py finds a running pod's network
namespace on the node, actions.py repairs, deletes or labels, service.py runs the loop.
"""
