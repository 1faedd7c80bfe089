"""Redirect rules: Istio's capture rules, built once as a model, rendered and applied.

config (CaptureConfig) -> builder (model) -> render_restore / render_nft / render_iptc;
flags and pod turn istio-iptables flags or a Pod into a CaptureConfig; apply programs a pod's
network namespace through one of the backends; cli is `istio-cni-agent rules`.
"""
