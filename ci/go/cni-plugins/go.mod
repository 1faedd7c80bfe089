// Builds ptp, host-local and portmap, the reference plugins of kind's conflist, at a release
// that speaks CNI 1.1.0 (STATUS): the primary of the node whose runtime calls STATUS (Debian's
// plugins speak up to 1.0.0).
module istio-cni.test/testbed/cni-plugins

go 1.24.2

require github.com/containernetworking/plugins v1.9.1

