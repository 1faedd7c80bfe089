"""Redirect rules: one engine, and the two modes' rules on top of it (sidecar/, ambient/).

The engine: the rule model (model; collector, which builders fill in Istio's order; ownership,
which says which chains and rules are ours), its iptables renderers (render_restore, render_save,
render_iptc) and backends (backend_restore, backend_iptc), the native nftables form (nft, run by
backend_nft), one backend chooser and dispatch for both modes (backends), and what is ours in a
namespace (footprint, probe).

A mode's settings reach a namespace one of two ways, by backend:
- iptables (python-iptables, iptables-legacy, iptables-nft): the mode's builder makes the model,
  which render_restore / render_iptc turn into the backend's input;
- nftables: the mode's own native rules (Istio's nftables modes are not translations of its
  iptables rules), data one rule a line turned into `nft -f` commands by agent.rules.nft; no
  model is built.

Modes: agent.rules.sidecar (Istio's istio-iptables capture for a CaptureConfig, from flags or a
pod) and agent.rules.ambient (in-pod redirection to ztunnel, the node's probe SNAT); cli is
`istio-cni-agent rules` for both.
"""
