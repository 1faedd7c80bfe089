"""Ambient mode's rules: Istio's in-pod redirection to ztunnel and the node's probe SNAT.

builder: both as the rule model (and the chains ambient owns); nft, nft_rules: Istio's native
nftables form, applied by nft_apply, with the enrolled-IP sets as nft sets (nft_sets) or ipsets
(ipset) and kubelet's UID (kubelet); routes: the in-pod policy routing. apply programs them
(InpodRules, HostProbeRules); cli is `istio-cni-agent rules --ambient`.
"""
