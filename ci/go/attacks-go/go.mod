// Builds attacks-go (testbed/attacks_go/main.go): the standard library only.
module istio-cni.test/testbed/attacks-go

go 1.24
