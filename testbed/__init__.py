"""The test bed: a real kube-apiserver with etcd on loopback, a simulated node, agent identities
from the TokenRequest API, a CNI runtime (cnitool with the reference plugins) in network
namespaces, and Helm into that API server. `tests.fixtures` holds the pytest fixtures."""
