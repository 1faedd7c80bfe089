"""Sidecar mode's rules: Istio's istio-iptables capture for one pod.

capture: the settings (CaptureConfig), from istio-iptables flags (flags) or a pod manifest, as
Istio's CNI plugin decides them (pod); hostfacts: the two settings Istio detects. builder: the
rule model for the iptables backends; nft, nft_rules: Istio's native nftables rules, applied by
nft_apply. apply programs, checks and removes them with the TPROXY routes (routes); cli is
`istio-cni-agent rules` without `--ambient`.
"""
