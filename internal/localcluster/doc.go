// Package localcluster starts a Kubernetes control plane on loopback for
// integration tests and the demo: a real etcd and a real kube-apiserver as
// child processes, with their own certificate authority, an admin
// kubeconfig, and the bootstrap objects a bare control plane lacks (the
// default ServiceAccount). Every file lives in one directory; processes run
// in their own process groups and die with the caller.
package localcluster
