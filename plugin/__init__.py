"""istio-cni CNI plugin: standard library only; its start-up time is pod start-up time."""
