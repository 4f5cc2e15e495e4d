package localnode

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// containerdConfig is what the containerd configuration is rendered from.
type containerdConfig struct {
	Root, State, Temp string
	Socket, TTRPC     string
	Opt               string
	RuncRoot          string
	Runc, Shim        string
	CNIBinDir         string
	CNIConfDir        string
	CDISpecDir        string
	RegistryHostsDir  string
	Snapshotter       string
	PauseImage        string
	LogLevel          string
}

// render returns a containerd 2.4 configuration (version 4). Every path
// containerd writes to is in the node's directory, except the shims' sockets,
// which containerd always puts in /run/containerd/s (named by a hash of the
// node's socket, so nodes do not collide).
func (c containerdConfig) render() string {
	q := strconv.Quote
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	line("# Written by kubegpu internal/localnode.")
	line("version = 4")
	line("root = %s", q(c.Root))
	line("state = %s", q(c.State))
	line("temp = %s", q(c.Temp))
	line("")
	line("[debug]")
	line("  level = %s", q(c.LogLevel))
	line("")
	line("[plugins.'io.containerd.server.v1.grpc']")
	line("  address = %s", q(c.Socket))
	line("")
	line("[plugins.'io.containerd.server.v1.ttrpc']")
	line("  address = %s", q(c.TTRPC))
	line("")
	line("[plugins.'io.containerd.internal.v1.opt']")
	line("  path = %s", q(c.Opt))
	line("")
	line("# The device shim, not NRI, edits containers; NRI's socket would be global.")
	line("[plugins.'io.containerd.nri.v1.nri']")
	line("  disable = true")
	line("")
	line("[plugins.'io.containerd.grpc.v1.cri']")
	line("  stream_server_address = \"127.0.0.1\"")
	line("  stream_server_port = \"0\"")
	line("")
	line("[plugins.'io.containerd.cri.v1.images']")
	line("  snapshotter = %s", q(c.Snapshotter))
	line("  [plugins.'io.containerd.cri.v1.images'.pinned_images]")
	line("    sandbox = %s", q(c.PauseImage))
	line("  [plugins.'io.containerd.cri.v1.images'.registry]")
	line("    config_path = %s", q(c.RegistryHostsDir))
	line("")
	line("[plugins.'io.containerd.cri.v1.runtime']")
	line("  # Without CAP_SYS_RESOURCE (this VM) every sandbox fails otherwise.")
	line("  restrict_oom_score_adj = true")
	line("  # CDI is always on in containerd 2.x; only the spec directories are set.")
	line("  cdi_spec_dirs = [%s]", q(c.CDISpecDir))
	line("  netns_mounts_under_state_dir = true")
	line("  [plugins.'io.containerd.cri.v1.runtime'.cni]")
	line("    bin_dirs = [%s]", q(c.CNIBinDir))
	line("    conf_dir = %s", q(c.CNIConfDir))
	line("    max_conf_num = 1")
	line("  [plugins.'io.containerd.cri.v1.runtime'.containerd]")
	line("    default_runtime_name = \"runc\"")
	line("    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]")
	line("      runtime_type = \"io.containerd.runc.v2\"")
	line("      runtime_path = %s", q(c.Shim))
	line("      sandboxer = \"podsandbox\"")
	line("      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]")
	line("        BinaryName = %s", q(c.Runc))
	line("        Root = %s", q(c.RuncRoot))
	line("        SystemdCgroup = false")
	return b.String()
}

// hostsTOML is a containerd registry host configuration that sends every
// pull of a registry to mirror ("http://127.0.0.1:5000") and nowhere else.
func hostsTOML(mirror string) string {
	q := strconv.Quote
	return "# Written by kubegpu internal/localnode.\n" +
		"server = " + q(mirror) + "\n\n" +
		"[host." + q(mirror) + "]\n" +
		"  capabilities = [\"pull\", \"resolve\"]\n"
}

// bridgeNetwork is the CNI network of a node: a bridge of its own with a
// /24 of its own, host-local IPAM with its state in the node's directory,
// no masquerading, and host ports through the portmap plugin (iptables NAT
// rules commented with the network's name).
type bridgeNetwork struct {
	Name     string // CNI network name
	Bridge   string // Linux bridge interface, at most 15 bytes
	Subnet   *net.IPNet
	IPAMDir  string
	Gateway  net.IP
	RangeEnd net.IP
}

// newBridgeNetwork picks the bridge name and subnet for a node directory:
// derived from a hash of dir, and moved on past subnets a host interface
// already uses.
func newBridgeNetwork(dir, ipamDir string, inUse func(*net.IPNet) bool) (*bridgeNetwork, error) {
	sum := sha256.Sum256([]byte(dir))
	id := fmt.Sprintf("%x", sum[:4])
	// 10.240.0.0/12 holds 4096 /24s.
	start := binary.BigEndian.Uint16(sum[4:6]) % 4096
	for i := uint16(0); i < 4096; i++ {
		n := (start + i) % 4096
		subnet := &net.IPNet{IP: net.IPv4(10, byte(240+n/256), byte(n%256), 0).To4(), Mask: net.CIDRMask(24, 32)}
		if inUse != nil && inUse(subnet) {
			continue
		}
		gw := append(net.IP(nil), subnet.IP...)
		gw[3] = 1
		end := append(net.IP(nil), subnet.IP...)
		end[3] = 254
		return &bridgeNetwork{Name: "kubegpu-" + id, Bridge: "kgpu" + id, Subnet: subnet,
			IPAMDir: ipamDir, Gateway: gw, RangeEnd: end}, nil
	}
	return nil, fmt.Errorf("no free /24 in 10.240.0.0/12 for the node's bridge")
}

// conflist renders the CNI configuration list.
func (n *bridgeNetwork) conflist() ([]byte, error) {
	type obj = map[string]any
	conf := obj{
		"cniVersion": "1.0.0",
		"name":       n.Name,
		"plugins": []obj{{
			"type":        "bridge",
			"bridge":      n.Bridge,
			"isGateway":   true,
			"ipMasq":      false,
			"hairpinMode": true,
			"ipam": obj{
				"type":    "host-local",
				"dataDir": n.IPAMDir,
				"ranges":  [][]obj{{{"subnet": n.Subnet.String(), "gateway": n.Gateway.String(), "rangeEnd": n.RangeEnd.String()}}},
				"routes":  []obj{{"dst": "0.0.0.0/0"}},
			},
		}, {
			"type":         "portmap",
			"capabilities": obj{"portMappings": true},
		}},
	}
	return json.MarshalIndent(conf, "", "  ")
}

// hostSubnetInUse reports whether an address of a host interface lies in
// subnet. (A wider host network around it does not matter: the bridge's
// /24 route is the more specific one.)
func hostSubnetInUse(subnet *net.IPNet) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		if subnet.Contains(ipn.IP) {
			return true
		}
	}
	return false
}
