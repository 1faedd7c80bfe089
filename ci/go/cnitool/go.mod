// Builds cnitool, the CNI reference runtime client the tests drive plugins with.
module istio-cni.test/testbed/cnitool

go 1.24

require github.com/containernetworking/cni v1.3.0

tool github.com/containernetworking/cni/cnitool
