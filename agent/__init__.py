"""istio-cni node agent: installs the plugin, watches the node's CNI config, redirects pods."""
