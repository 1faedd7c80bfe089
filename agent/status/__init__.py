"""`istio-cni-agent status`: what the running agent did to its node's pods (a read-only socket)."""
