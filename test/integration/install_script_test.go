package integration

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// scriptRoot is a temp root (KUBEGPU_ROOT) on which crishim/deploy/install.sh
// runs from fake builds, with a systemctl stand-in that records its calls
// and fails the one named by FAIL_SYSTEMCTL. Nothing is started: these
// tests check the files the script leaves, not a running shim.
type scriptRoot struct {
	t                      *testing.T
	dir, root              string
	systemctl, calls, kcfg string
}

func newScriptRoot(t *testing.T) *scriptRoot {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("install.sh runs as root")
	}
	dir := t.TempDir()
	s := &scriptRoot{t: t, dir: dir, root: filepath.Join(dir, "root"), systemctl: filepath.Join(dir, "systemctl"),
		calls: filepath.Join(dir, "systemctl.calls"), kcfg: filepath.Join(dir, "kubelet.conf")}
	s.write(s.systemctl, 0o755, fmt.Sprintf("#!/bin/sh\necho \"$*\" >> %s\n[ \"$*\" != \"$FAIL_SYSTEMCTL\" ]\n", s.calls))
	s.write(s.kcfg, 0o600, "kubeconfig\n")
	return s
}

func (s *scriptRoot) write(path string, mode os.FileMode, content string) {
	s.t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		s.t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		s.t.Fatal(err)
	}
}

// build makes a fake build laid out as _output: a kubegpu-crishim that
// prints version for `version` and, for `devices`, writes its arguments
// one a line to DEVICES_LOG; and a simgpu.so that is only bytes.
func (s *scriptRoot) build(version string) string {
	s.t.Helper()
	dir := filepath.Join(s.dir, "build-"+version)
	s.write(filepath.Join(dir, "bin/kubegpu-crishim"), 0o755,
		"#!/bin/sh\ncase $1 in\nversion) echo "+version+" ;;\ndevices) shift; [ -z \"$DEVICES_LOG\" ] || printf '%s\\n' \"$@\" > \"$DEVICES_LOG\" ;;\nesac\n")
	s.write(filepath.Join(dir, "plugins/simgpu.so"), 0o644, "simgpu module "+version+"\n")
	return dir
}

// key writes a public key file with content and returns its path.
func (s *scriptRoot) key(content string) string {
	s.t.Helper()
	p := filepath.Join(s.dir, fmt.Sprintf("key-%x.pem", sha256.Sum256([]byte(content))))
	s.write(p, 0o644, content)
	return p
}

// run runs script (install.sh unless a test gives another) with env and
// args; it returns the output, the systemctl calls and the error.
func (s *scriptRoot) run(script string, env []string, args ...string) (string, []string, error) {
	s.t.Helper()
	if script == "" {
		script = filepath.Join(repoRoot, "crishim/deploy/install.sh")
	}
	cmd := exec.Command("bash", append([]string{script}, args...)...)
	cmd.Env = append(append(os.Environ(), "KUBEGPU_ROOT="+s.root, "KUBEGPU_SYSTEMCTL="+s.systemctl), env...)
	out, err := cmd.CombinedOutput()
	b, rerr := os.ReadFile(s.calls)
	if rerr != nil && !os.IsNotExist(rerr) {
		s.t.Fatal(rerr)
	}
	_ = os.Remove(s.calls)
	var calls []string
	if c := strings.TrimSpace(string(b)); c != "" {
		calls = strings.Split(c, "\n")
	}
	return string(out), calls, err
}

// install runs install.sh from build with the node's usual flags and
// extra ones.
func (s *scriptRoot) install(build, key string, env []string, extra ...string) (string, []string, error) {
	s.t.Helper()
	return s.run("", env, append([]string{"--from", build, "--kubeconfig", s.kcfg, "--allocation-key", key, "--module", "simgpu"}, extra...)...)
}

func (s *scriptRoot) mustInstall(build, key string, extra ...string) []string {
	s.t.Helper()
	out, calls, err := s.install(build, key, nil, extra...)
	if err != nil {
		s.t.Fatalf("install.sh: %v\n%s", err, out)
	}
	return calls
}

// snapshot describes every file and link under the root (directories
// only through what they hold): mode and digest, or link target.
func (s *scriptRoot) snapshot() map[string]string {
	s.t.Helper()
	got := map[string]string{}
	err := filepath.WalkDir(s.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) && p == s.root {
				return filepath.SkipDir
			}
			return err
		}
		rel, _ := filepath.Rel(s.root, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			got[rel] = "-> " + target
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			got[rel] = fmt.Sprintf("%v %x", info.Mode(), sha256.Sum256(b))
		}
		return nil
	})
	if err != nil {
		s.t.Fatal(err)
	}
	return got
}

// sameFiles fails the test where the root's files are not those of want.
func (s *scriptRoot) sameFiles(what string, want map[string]string) {
	s.t.Helper()
	got := s.snapshot()
	if maps.Equal(got, want) {
		return
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if want[k] != got[k] {
			s.t.Errorf("%s: /%s is %q, was %q", what, k, got[k], want[k])
		}
	}
	for k := range want {
		if _, ok := got[k]; !ok {
			s.t.Errorf("%s: /%s is gone, was %q", what, k, want[k])
		}
	}
}

// running is what the installed unit would run: the binary's version
// and the module of the plugin directory its options name.
func (s *scriptRoot) running() string {
	s.t.Helper()
	v, err := exec.Command(filepath.Join(s.root, "usr/local/bin/kubegpu-crishim"), "version").Output()
	if err != nil {
		s.t.Fatalf("installed binary: %v", err)
	}
	var dir string
	for _, a := range installedArgs(s.t, s.root) {
		if d, ok := strings.CutPrefix(a, "--plugin-dir="); ok {
			dir = d
		}
	}
	m, err := os.ReadFile(filepath.Join(s.root, dir, "simgpu.so"))
	if err != nil {
		s.t.Fatalf("installed module: %v", err)
	}
	return strings.TrimSpace(string(v)) + " + " + strings.TrimSpace(string(m))
}

// TestInstallScriptQuotesPluginOptions: a --plugin-option value with
// spaces, double and single quotes and backslashes reaches the shim as one
// argument, unchanged, both in the check before install and through the
// installed EnvironmentFile as systemd reads it; a value the file cannot
// carry is refused before anything is written.
func TestInstallScriptQuotesPluginOptions(t *testing.T) {
	s := newScriptRoot(t)
	build := s.build("v1")
	key := s.key("key one\n")
	opts := []string{`simgpu.note=a "quoted" value`, `simgpu.path=C:\dir\ it's`, "simgpu.preset=t4x4", "simgpu.tab=$HOME %n `x`"}
	var flags []string
	for _, o := range opts {
		flags = append(flags, "--plugin-option", o)
	}
	log := filepath.Join(s.dir, "devices.log")
	out, _, err := s.install(build, key, []string{"DEVICES_LOG=" + log}, flags...)
	if err != nil {
		t.Fatalf("install.sh: %v\n%s", err, out)
	}
	pre, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	args := installedArgs(t, s.root)
	if len(args) != len(opts)+2 || !strings.HasPrefix(args[0], "--plugin-dir=/usr/lib/kubegpu/releases/") || !strings.HasPrefix(args[len(args)-1], "--plugin-sha256=simgpu.so=") {
		t.Fatalf("installed arguments: %q", args)
	}
	for i, o := range opts {
		if want := "--plugin-option=" + o; args[i+1] != want {
			t.Errorf("installed argument %d: %q, want %q", i+1, args[i+1], want)
		}
		if want := "--plugin-option=" + o + "\n"; !strings.Contains(string(pre), want) {
			t.Errorf("the check before install was given:\n%s\nwant a line %q", pre, want)
		}
	}
	if got := s.running(); got != "v1 + simgpu module v1" {
		t.Errorf("installed: %s", got)
	}

	before := s.snapshot()
	for _, bad := range []string{"simgpu.note=two\nlines", "simgpu.note=a\rb", "simgpu.note=tab\there", "simgpu.note=caf\u00e9"} {
		out, calls, err := s.install(s.build("v2"), key, nil, "--plugin-option", bad)
		if err == nil || !strings.Contains(out, "refused: a value may hold printable ASCII only") || len(calls) != 0 {
			t.Errorf("install with --plugin-option %q: %v, calls %q\n%s", bad, err, calls, out)
		}
		s.sameFiles(fmt.Sprintf("after --plugin-option %q was refused", bad), before)
	}
}

// TestInstallScriptRollsBack: a failure at any step of an install or an
// upgrade, after files were swapped, leaves the node with exactly the files
// it had (the previous build whole, or nothing), and no restart; the
// same install then succeeds. Failures come from KUBEGPU_INSTALL_FAIL_AFTER
// (the script fails right after swapping that path) or from systemctl.
func TestInstallScriptRollsBack(t *testing.T) {
	type failure struct {
		name string
		env  []string
	}
	after := func(path string) failure {
		return failure{"after " + path, []string{"KUBEGPU_INSTALL_FAIL_AFTER=" + path}}
	}
	check := func(t *testing.T, s *scriptRoot, before map[string]string, out string, calls []string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(out, "rolled back") {
			t.Fatalf("install.sh: %v, want a failure that rolls back\n%s", err, out)
		}
		for _, c := range calls {
			if strings.HasPrefix(c, "restart") || strings.HasPrefix(c, "start") {
				t.Errorf("a failed install called systemctl %s", c)
			}
		}
		s.sameFiles("after a failed install", before)
	}

	t.Run("first install", func(t *testing.T) {
		for _, f := range []failure{after("/usr/lib/kubegpu/releases/*"), after("/etc/kubegpu/kubeconfig"), after("/usr/lib/kubegpu/current"),
			after("/etc/default/kubegpu-crishim"), after("/usr/local/bin/kubegpu-crishim"), after("/etc/systemd/system/kubegpu-crishim.service"),
			{"daemon-reload fails", []string{"FAIL_SYSTEMCTL=daemon-reload"}}, {"enable fails", []string{"FAIL_SYSTEMCTL=enable kubegpu-crishim"}}} {
			t.Run(f.name, func(t *testing.T) {
				s := newScriptRoot(t)
				s.write(filepath.Join(s.root, "var/lib/kubelet/config.yaml"), 0o644, "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n")
				before := s.snapshot()
				out, calls, err := s.install(s.build("v1"), s.key("k1\n"), f.env, "--kubelet-config", "/var/lib/kubelet/config.yaml")
				check(t, s, before, out, calls, err)
				if slices.Contains(calls, "daemon-reload") && !slices.Equal(calls[len(calls)-1:], []string{"daemon-reload"}) {
					t.Errorf("systemctl calls %q: a unit rolled back after daemon-reload needs another", calls)
				}
			})
		}
	})

	t.Run("upgrade", func(t *testing.T) {
		for _, f := range []failure{after("/usr/lib/kubegpu/releases/*"), after("/etc/kubegpu/allocation-key.pub.pem"),
			after("/usr/lib/kubegpu/current"), {"enable fails", []string{"FAIL_SYSTEMCTL=enable kubegpu-crishim"}}} {
			t.Run(f.name, func(t *testing.T) {
				s := newScriptRoot(t)
				allow := filepath.Join(s.dir, "allowlist.yaml")
				s.write(allow, 0o644, "namespaces: [monitoring]\n")
				s.mustInstall(s.build("v1"), s.key("k1\n"), "--plugin-option", "simgpu.note=old one", "--gpu-allowlist", allow)
				before := s.snapshot()
				// The upgrade changes the build, the key and an option, and
				// drops the allowlist.
				out, calls, err := s.install(s.build("v2"), s.key("k2\n"), f.env, "--plugin-option", "simgpu.note=new one")
				check(t, s, before, out, calls, err)
				if got := s.running(); got != "v1 + simgpu module v1" {
					t.Errorf("after the failed upgrade the unit would run %s", got)
				}
				calls = s.mustInstall(s.build("v2"), s.key("k2\n"), "--plugin-option", "simgpu.note=new one")
				if !slices.Equal(calls, []string{"enable kubegpu-crishim", "restart kubegpu-crishim"}) {
					t.Errorf("the upgrade called systemctl %q", calls)
				}
				if got := s.running(); got != "v2 + simgpu module v2" {
					t.Errorf("after the upgrade the unit would run %s", got)
				}
				if args := installedArgs(t, s.root); !slices.Contains(args, "--plugin-option=simgpu.note=new one") || slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--gpu-allowlist") }) {
					t.Errorf("installed arguments after the upgrade: %q", args)
				}
				if _, err := os.Lstat(filepath.Join(s.root, "etc/kubegpu/gpu-allowlist.yaml")); !os.IsNotExist(err) {
					t.Errorf("the allowlist no longer given is still installed (%v)", err)
				}
				if r, _ := filepath.Glob(filepath.Join(s.root, "usr/lib/kubegpu/releases/*")); len(r) != 1 {
					t.Errorf("releases after the upgrade: %q, want only the one installed", r)
				}
				for p, v := range s.snapshot() {
					if strings.Contains(p, ".kubegpu-") {
						t.Errorf("left behind: /%s (%s)", p, v)
					}
				}
			})
		}
	})

	// From the layout before releases (a plain binary, a plugin directory
	// of its own, an options file, a unit that names the directory): a
	// failure halfway through the move to links leaves the old files as
	// they were.
	t.Run("from the layout before releases", func(t *testing.T) {
		for _, f := range []failure{after("/etc/default/kubegpu-crishim"), after("/usr/lib/kubegpu/plugins"),
			{"daemon-reload fails", []string{"FAIL_SYSTEMCTL=daemon-reload"}}, {"none", nil}} {
			t.Run(f.name, func(t *testing.T) {
				s := newScriptRoot(t)
				v1 := s.build("v1")
				key := s.key("k1\n")
				for dst, src := range map[string]string{"usr/local/bin/kubegpu-crishim": "bin/kubegpu-crishim", "usr/lib/kubegpu/plugins/simgpu.so": "plugins/simgpu.so"} {
					b, err := os.ReadFile(filepath.Join(v1, src))
					if err != nil {
						t.Fatal(err)
					}
					s.write(filepath.Join(s.root, dst), 0o755, string(b))
				}
				s.write(filepath.Join(s.root, "etc/default/kubegpu-crishim"), 0o644, "KUBEGPU_CRISHIM_ARGS=\"--plugin-sha256=simgpu.so=0123\"\n")
				s.write(filepath.Join(s.root, "etc/systemd/system/kubegpu-crishim.service"), 0o644, "[Service]\nExecStart=/usr/local/bin/kubegpu-crishim --plugin-dir=/usr/lib/kubegpu/plugins $KUBEGPU_CRISHIM_ARGS\n")
				s.write(filepath.Join(s.root, "etc/kubegpu/allocation-key.pub.pem"), 0o644, "k1\n")
				if err := os.Symlink(s.kcfg, filepath.Join(s.root, "etc/kubegpu/kubeconfig")); err != nil {
					t.Fatal(err)
				}
				before := s.snapshot()
				out, calls, err := s.install(s.build("v2"), key, f.env)
				if f.env != nil {
					check(t, s, before, out, calls, err)
					return
				}
				if err != nil {
					t.Fatalf("install.sh over the previous layout: %v\n%s", err, out)
				}
				if !slices.Equal(calls, []string{"daemon-reload", "enable kubegpu-crishim", "restart kubegpu-crishim"}) {
					t.Errorf("systemctl calls %q", calls)
				}
				if got := s.running(); got != "v2 + simgpu module v2" {
					t.Errorf("after the upgrade the unit would run %s", got)
				}
				if _, err := os.Lstat(filepath.Join(s.root, "usr/lib/kubegpu/plugins")); !os.IsNotExist(err) {
					t.Errorf("the previous layout's plugin directory is still there (%v)", err)
				}
			})
		}
	})
}

// TestInstallScriptUninstallRefuses: without a record of kubelet's
// endpoint (install was not given kubelet's files), uninstall refuses
// while kubelet may talk to the shim, and says what --force does; it goes
// ahead when kubelet's files show another endpoint, or with --force, which
// leaves kubelet's files as they are.
func TestInstallScriptUninstallRefuses(t *testing.T) {
	const containerd = "unix:///run/containerd/containerd.sock"
	for _, c := range []struct {
		name   string
		files  map[string]string // kubelet's files, under the root
		args   []string
		refuse bool
	}{
		{name: "config names the shim", files: map[string]string{"var/lib/kubelet/config.yaml": "containerRuntimeEndpoint: " + shimEndpoint + "\n"}, refuse: true},
		{name: "flag names the shim", files: map[string]string{"var/lib/kubelet/config.yaml": "containerRuntimeEndpoint: " + containerd + "\n",
			"etc/default/kubelet": "KUBELET_EXTRA_ARGS=--container-runtime-endpoint=" + shimEndpoint + "\n"}, refuse: true},
		{name: "nothing found", refuse: true},
		{name: "nothing found, --force", args: []string{"--force"}},
		{name: "config names the shim, --force", files: map[string]string{"var/lib/kubelet/config.yaml": "containerRuntimeEndpoint: " + shimEndpoint + "\n"}, args: []string{"--force"}},
		{name: "config names containerd", files: map[string]string{"var/lib/kubelet/config.yaml": "containerRuntimeEndpoint: " + containerd + "\n"}},
		{name: "flags name containerd", files: map[string]string{"var/lib/kubelet/kubeadm-flags.env": `KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=` + containerd + `"` + "\n"}},
		{name: "given config names containerd", files: map[string]string{"etc/kubelet/config.yaml": "containerRuntimeEndpoint: " + containerd + "\n"},
			args: []string{"--kubelet-config", "/etc/kubelet/config.yaml"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newScriptRoot(t)
			for p, content := range c.files {
				s.write(filepath.Join(s.root, p), 0o644, content)
			}
			s.mustInstall(s.build("v1"), s.key("k1\n"))
			before := s.snapshot()
			out, calls, err := s.run("", nil, append([]string{"--uninstall"}, c.args...)...)
			if c.refuse {
				if err == nil || !strings.Contains(out, "refusing to uninstall") || !strings.Contains(out, "--force removes the shim anyway and leaves kubelet's endpoint as it is") || len(calls) != 0 {
					t.Fatalf("uninstall: %v, calls %q, want a refusal that explains --force\n%s", err, calls, out)
				}
				s.sameFiles("after a refused uninstall", before)
				return
			}
			if err != nil {
				t.Fatalf("uninstall: %v\n%s", err, out)
			}
			if want := []string{"disable --now kubegpu-crishim", "daemon-reload"}; !slices.Equal(calls, want) {
				t.Errorf("uninstall called systemctl %q, want %q\n%s", calls, want, out)
			}
			if slices.Contains(c.args, "--force") && !strings.Contains(out, "--force: removing the shim and leaving kubelet's endpoint as it is") {
				t.Errorf("uninstall --force does not say what it left:\n%s", out)
			}
			want := map[string]string{}
			for p, v := range before {
				if _, ok := c.files[p]; ok {
					want[p] = v
				}
			}
			s.sameFiles("after uninstall (only kubelet's files, untouched)", want)
		})
	}
}
