// Package localnode starts a container node on this machine for
// integration tests: containerd 2.x with its CRI plugin as a child process,
// runc, a CNI bridge network and CDI, with every file in one directory. It
// is the node side of what localcluster is for the control plane, and the
// backend the CRI shim's tests put the shim in front of.
//
// Start writes containerd's configuration into the node's directory,
// starts containerd in its own process group, waits until CRI reports the
// runtime and the network ready, and imports PauseImage (busybox sleeping
// forever), the pod sandbox image, since nothing can be pulled. Pods get
// their own bridge and /24; CDI specs dropped into Node.CDISpecDir are
// injected into containers that ask for their devices. Restart kills
// containerd and starts it again on the same state; Stop removes the pods,
// stops containerd and then kills, unmounts and deletes whatever is left.
//
// Images come from WriteImageArchive: a single-layer OCI image of the
// host's static busybox (Debian busybox-static) under any names, imported
// with Node.ImportImage (ctr images import).
//
// The binaries (containerd, containerd-shim-runc-v2, ctr, crictl) are built
// by make node-binaries into _output/tools/bin; runc, the CNI plugins and
// busybox are Debian packages that make deps installs. The package needs
// root. See README.md for the layout of the node's directory.
package localnode
