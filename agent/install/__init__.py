"""Put the plugin and its CNI config entry on the node, keep them there, take them away.

atomic       one atomic_write for every file the agent puts on the node
binaries     pluginSourceDir -> mountedCniBinDir (files and content-hashed support dirs)
conflist     pure functions on CNI configs: pick the primary, insert/remove our entry
entry        our plugin entry (what the plugin reads)
plan         pure: which file holds our entry and what it must contain
ledger       content hashes of what we wrote (our own writes never wake the watcher)
installer    install once / check / uninstall, with an undo log
watcher      re-install when someone removes or changes what we put there
conflicts    counting fights with another writer, naming the likely culprit
stop_policy  on SIGTERM: uninstall (DaemonSet going away) or keep (upgrade, reboot)
commands     `istio-cni-agent install` and `uninstall`
"""
