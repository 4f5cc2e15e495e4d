package localnode

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestContainerdConfig(t *testing.T) {
	cfg := containerdConfig{
		Root: "/n/root", State: "/n/state", Temp: "/n/tmp", Opt: "/n/opt",
		Socket: "/n/containerd.sock", TTRPC: "/n/containerd.sock.ttrpc",
		RuncRoot: "/n/runc", Runc: "/usr/sbin/runc", Shim: "/bin/containerd-shim-runc-v2",
		CNIBinDir: "/usr/lib/cni", CNIConfDir: "/n/cni/net.d", CDISpecDir: "/n/cdi", RegistryHostsDir: "/n/certs.d",
		Snapshotter: "overlayfs", PauseImage: PauseImage, LogLevel: "info",
	}.render()
	// What the node depends on; containerd itself checks the rest at start.
	for _, want := range []string{
		"version = 4\n",
		`root = "/n/root"`,
		`state = "/n/state"`,
		"[plugins.'io.containerd.server.v1.grpc']\n  address = \"/n/containerd.sock\"",
		"[plugins.'io.containerd.server.v1.ttrpc']\n  address = \"/n/containerd.sock.ttrpc\"",
		"restrict_oom_score_adj = true",
		`cdi_spec_dirs = ["/n/cdi"]`,
		"netns_mounts_under_state_dir = true",
		`bin_dirs = ["/usr/lib/cni"]`,
		`conf_dir = "/n/cni/net.d"`,
		`runtime_path = "/bin/containerd-shim-runc-v2"`,
		`BinaryName = "/usr/sbin/runc"`,
		`Root = "/n/runc"`,
		`sandbox = "` + PauseImage + `"`,
		`snapshotter = "overlayfs"`,
		"[plugins.'io.containerd.nri.v1.nri']\n  disable = true",
		`path = "/n/opt"`,
		`config_path = "/n/certs.d"`,
	} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
}

func TestHostsTOML(t *testing.T) {
	want := `# Written by kubegpu internal/localnode.
server = "http://127.0.0.1:5000"

[host."http://127.0.0.1:5000"]
  capabilities = ["pull", "resolve"]
`
	if got := hostsTOML("http://127.0.0.1:5000"); got != want {
		t.Errorf("hosts.toml:\n%s\nwant:\n%s", got, want)
	}
}

func TestBridgeNetwork(t *testing.T) {
	a, err := newBridgeNetwork("/tmp/node-a", "/tmp/node-a/cni/ipam", nil)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := newBridgeNetwork("/tmp/node-a", "/tmp/node-a/cni/ipam", nil)
	b, _ := newBridgeNetwork("/tmp/node-b", "/tmp/node-b/cni/ipam", nil)
	if a.Bridge != again.Bridge || a.Subnet.String() != again.Subnet.String() {
		t.Errorf("same directory, different networks: %+v, %+v", a, again)
	}
	if a.Bridge == b.Bridge || a.Subnet.String() == b.Subnet.String() || a.Name == b.Name {
		t.Errorf("two directories share a bridge or subnet: %+v, %+v", a, b)
	}
	if len(a.Bridge) > 15 {
		t.Errorf("bridge name %q is longer than an interface name may be (15)", a.Bridge)
	}
	if _, tenTwoForty, _ := net.ParseCIDR("10.240.0.0/12"); !tenTwoForty.Contains(a.Subnet.IP) {
		t.Errorf("subnet %s outside 10.240.0.0/12", a.Subnet)
	}

	// A subnet a host interface uses is skipped.
	moved, _ := newBridgeNetwork("/tmp/node-a", "/tmp/node-a/cni/ipam", func(n *net.IPNet) bool {
		return n.String() == a.Subnet.String()
	})
	if moved.Subnet.String() == a.Subnet.String() {
		t.Errorf("subnet %s in use, still chosen", a.Subnet)
	}
	if _, err := newBridgeNetwork("/tmp/node-a", "", func(*net.IPNet) bool { return true }); err == nil {
		t.Error("every subnet in use: want an error")
	}

	conf, err := a.conflist()
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Name    string `json:"name"`
		Plugins []struct {
			Type   string `json:"type"`
			Bridge string `json:"bridge"`
			IPAM   struct {
				DataDir string `json:"dataDir"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(conf, &parsed); err != nil {
		t.Fatal(err)
	}
	if parsed.Name != a.Name || len(parsed.Plugins) != 2 || parsed.Plugins[0].Type != "bridge" || parsed.Plugins[1].Type != "portmap" ||
		parsed.Plugins[0].Bridge != a.Bridge || parsed.Plugins[0].IPAM.DataDir != "/tmp/node-a/cni/ipam" {
		t.Errorf("conflist:\n%s", conf)
	}
}

func TestPortMappingRules(t *testing.T) {
	out := `-N CNI-HOSTPORT-DNAT
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"kubegpu-3d498dcc\" id: \"e4f4\"" -m multiport --dports 12099 -j CNI-DN-43e6ed9b84488a56c16b9
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"kubegpu-other\" id: \"aaaa\"" -m multiport --dports 12000 -j CNI-DN-0000
`
	rules := portMappingRules(out, "kubegpu-3d498dcc")
	if len(rules) != 1 {
		t.Fatalf("rules %+v, want the one of kubegpu-3d498dcc", rules)
	}
	want := []string{"CNI-HOSTPORT-DNAT", "-p", "tcp", "-m", "comment", "--comment", `dnat name: "kubegpu-3d498dcc" id: "e4f4"`,
		"-m", "multiport", "--dports", "12099", "-j", "CNI-DN-43e6ed9b84488a56c16b9"}
	if strings.Join(rules[0].spec, "|") != strings.Join(want, "|") || rules[0].chain != "CNI-DN-43e6ed9b84488a56c16b9" {
		t.Errorf("rule %q (chain %s), want %q", rules[0].spec, rules[0].chain, want)
	}
}

func TestUnescapeMountPath(t *testing.T) {
	for in, want := range map[string]string{
		`/tmp/plain`:         "/tmp/plain",
		`/tmp/a\040b`:        "/tmp/a b",
		`/tmp/tab\011x\134y`: "/tmp/tab\tx\\y",
		`/tmp/short\04`:      `/tmp/short\04`,
	} {
		if got := unescapeMountPath(in); got != want {
			t.Errorf("unescapeMountPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestStartErrorsNameWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"no dir", Options{BinDir: dir}, "Options.Dir"},
		{"no bin dir", Options{Dir: dir}, "make node-binaries"},
		{"empty bin dir", Options{Dir: dir, BinDir: dir}, "containerd binary not found at " + filepath.Join(dir, "containerd") + ": build them with make node-binaries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Start(t.Context(), tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Start: %v, want an error containing %q", err, tc.want)
			}
		})
	}

	// Every binary present but runc: the error says how to install it.
	bin := t.TempDir()
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "crictl"} {
		if err := os.WriteFile(filepath.Join(bin, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_, err := Start(t.Context(), Options{Dir: dir, BinDir: bin, Runc: filepath.Join(dir, "no-runc"), ReadyTimeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "install Debian's runc (make deps)") {
		t.Errorf("Start without runc: %v, want an error naming the runc package", err)
	}
}
