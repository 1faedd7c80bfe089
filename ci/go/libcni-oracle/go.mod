// Builds libcni-oracle (testbed/libcni_oracle/main.go): the conf file libcni would load.
module istio-cni.test/testbed/libcni-oracle

go 1.24

require github.com/containernetworking/cni v1.3.0
