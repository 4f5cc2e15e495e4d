package localnode

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Stop removes every pod through CRI (so that CNI releases their network),
// stops containerd, then makes sure nothing of the node is left: it kills
// the containers and shims that remain, unmounts everything under the
// node's directory and deletes the node's bridge. The files stay in Dir.
// Stop can be called more than once.
func (n *Node) Stop() error {
	var errs []error
	if n.proc != nil && !n.proc.Exited() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		if _, err := n.Crictl(ctx, "rmp", "--force", "--all"); err != nil {
			errs = append(errs, fmt.Errorf("remove pods: %w", err))
		}
		cancel()
	}
	if n.proc != nil {
		if err := n.proc.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stop containerd: %w", err))
		}
		n.proc = nil
	}
	sockets := n.shimSockets()
	errs = append(errs, n.deleteContainers(), n.killShims())
	for _, s := range sockets {
		if err := os.Remove(s); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, UnmountUnder(n.Dir), n.deleteBridge(), n.removeCNIResults(), n.removePortMappings())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("localnode: stop (containerd log: %s): %w", n.Log, err)
	}
	return nil
}

// deleteContainers force-deletes (SIGKILL) every container in the node's
// runc root: those containerd did not remove.
func (n *Node) deleteContainers() error {
	nsDirs, err := os.ReadDir(filepath.Join(n.Dir, "runc"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	var errs []error
	for _, ns := range nsDirs {
		if !ns.IsDir() {
			continue
		}
		root := filepath.Join(n.Dir, "runc", ns.Name())
		ctrs, err := os.ReadDir(root)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, c := range ctrs {
			if _, err := os.Stat(filepath.Join(root, c.Name(), "state.json")); err != nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, err := run(ctx, n.opts.Runc, "--root", root, "delete", "--force", c.Name())
			cancel()
			if err != nil {
				errs = append(errs, fmt.Errorf("delete container %s: %w", c.Name(), err))
			}
		}
	}
	return errors.Join(errs...)
}

// shimSockets lists the sockets of the node's shims, which containerd keeps
// outside the node's directory (in /run/containerd/s); a shim that is
// killed leaves its socket behind.
func (n *Node) shimSockets() []string {
	bootstraps, _ := filepath.Glob(filepath.Join(n.Dir, "state", "io.containerd.runtime.v2.task", "*", "*", "bootstrap.json"))
	var sockets []string
	for _, b := range bootstraps {
		data, err := os.ReadFile(b)
		if err != nil {
			continue
		}
		var params struct {
			Address string `json:"address"`
		}
		if json.Unmarshal(data, &params) != nil {
			continue
		}
		if p, ok := strings.CutPrefix(params.Address, "unix://"); ok && strings.HasPrefix(p, "/run/containerd/s/") {
			sockets = append(sockets, p)
		}
	}
	return sockets
}

// killShims kills the shims started by the node's containerd (those that
// have "-address <socket>" on their command line) and waits until they
// are gone.
func (n *Node) killShims() error {
	pids, err := n.shimPIDs()
	if err != nil || len(pids) == 0 {
		return err
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		left, err := n.shimPIDs()
		if err != nil || len(left) == 0 {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
	left, _ := n.shimPIDs()
	return fmt.Errorf("shims %v still running 10s after SIGKILL", left)
}

// shimPIDs returns the live (not zombie) shim processes of the node.
func (n *Node) shimPIDs() ([]int, error) {
	return FindProcesses(func(args []string) bool {
		if !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			return false
		}
		for i := 0; i+1 < len(args); i++ {
			if (args[i] == "-address" || args[i] == "--address") && args[i+1] == n.Socket {
				return true
			}
		}
		return false
	})
}

// FindProcesses returns the processes, zombies excepted, whose command line
// match accepts.
func FindProcesses(match func(args []string) bool) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 { // gone, or a zombie or kernel thread
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if match(args) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// createBridge creates the node's bridge with its gateway address, up, so
// that kubelet can serve on the node's address before the first pod; the
// CNI bridge plugin takes on a bridge that has its gateway address.
func (n *Node) createBridge(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"link", "add", n.Bridge, "type", "bridge"},
		{"addr", "add", n.IP + "/24", "dev", n.Bridge},
		{"link", "set", n.Bridge, "up"},
	} {
		if _, err := run(ctx, "ip", args...); err != nil {
			return fmt.Errorf("localnode: create bridge %s: %w", n.Bridge, err)
		}
	}
	return nil
}

// deleteBridge deletes the node's bridge, which the CNI bridge plugin
// never deletes.
func (n *Node) deleteBridge() error {
	if n.Bridge == "" {
		return nil
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", n.Bridge)); err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := run(ctx, "ip", "link", "delete", n.Bridge); err != nil {
		return fmt.Errorf("delete bridge %s: %w", n.Bridge, err)
	}
	return nil
}

// removeCNIResults removes what CNI cached of the node's pods in
// /var/lib/cni/results (NETWORK-SANDBOX-eth0 and cni-loopback-SANDBOX-lo);
// CNI removes it itself when a pod is removed through CRI, but not when
// containerd was killed.
func (n *Node) removeCNIResults() error {
	if n.cniNetwork == "" {
		return nil
	}
	const cache = "/var/lib/cni/results"
	results, _ := filepath.Glob(filepath.Join(cache, n.cniNetwork+"-*"))
	// The sandboxes' directories, in containerd's root and state.
	sandboxes, _ := filepath.Glob(filepath.Join(n.Dir, "*", "io.containerd.grpc.v1.cri", "sandboxes", "*"))
	for _, sb := range sandboxes {
		results = append(results, filepath.Join(cache, "cni-loopback-"+filepath.Base(sb)+"-lo"))
	}
	var errs []error
	for _, r := range results {
		if err := os.Remove(r); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removePortMappings deletes the host port rules the CNI portmap plugin
// made for the node's pods (in iptables' nat table, commented with the
// network's name); CNI deletes them itself when a pod is removed through
// CRI, but not when containerd was killed, and a stale rule would send a
// host port to a dead pod.
func (n *Node) removePortMappings() error {
	if n.cniNetwork == "" {
		return nil
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := run(ctx, "iptables", "-w", "-t", "nat", "-S", "CNI-HOSTPORT-DNAT")
	if err != nil {
		return nil // no chain: no host ports were ever mapped
	}
	var errs []error
	for _, rule := range portMappingRules(string(out), n.cniNetwork) {
		if _, err := run(ctx, "iptables", append([]string{"-w", "-t", "nat", "-D"}, rule.spec...)...); err != nil {
			errs = append(errs, err)
			continue
		}
		if rule.chain != "" {
			_, _ = run(ctx, "iptables", "-w", "-t", "nat", "-F", rule.chain)
			_, _ = run(ctx, "iptables", "-w", "-t", "nat", "-X", rule.chain)
		}
	}
	return errors.Join(errs...)
}

type natRule struct {
	spec  []string // chain and match, as iptables -D takes them
	chain string   // the per-pod chain the rule jumps to
}

// portMappingRules picks the rules of network from iptables -S output.
func portMappingRules(out, network string) []natRule {
	var rules []natRule
	for _, line := range strings.Split(out, "\n") {
		words := splitShellWords(line)
		if len(words) < 2 || words[0] != "-A" {
			continue
		}
		mine := false
		var r natRule
		for i, w := range words {
			if strings.HasPrefix(w, "dnat name: \""+network+"\"") {
				mine = true
			}
			if w == "-j" && i+1 < len(words) && strings.HasPrefix(words[i+1], "CNI-DN-") {
				r.chain = words[i+1]
			}
		}
		if mine {
			r.spec = words[1:]
			rules = append(rules, r)
		}
	}
	return rules
}

// splitShellWords splits a line of iptables -S output into words the way a
// shell would: double quotes group, backslash escapes.
func splitShellWords(line string) []string {
	var words []string
	var w strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\\' && i+1 < len(line):
			i++
			w.WriteByte(line[i])
			inWord = true
		case c == '"':
			quoted = !quoted
			inWord = true
		case (c == ' ' || c == '\t') && !quoted:
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// UnmountUnder lazily unmounts (MNT_DETACH) every mount at or below dir,
// deepest first: what containerd leaves when it is killed (container root
// filesystems, sandbox /dev/shm, network namespaces, snapshots).
func UnmountUnder(dir string) error {
	for pass := 0; ; pass++ {
		mounts, err := MountsUnder(dir)
		if err != nil {
			return err
		}
		if len(mounts) == 0 {
			return nil
		}
		if pass == 5 {
			return fmt.Errorf("mounts left under %s: %s", dir, strings.Join(mounts, ", "))
		}
		for _, m := range mounts {
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil &&
				!errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				return fmt.Errorf("unmount %s: %w", m, err)
			}
		}
	}
}

// MountsUnder returns the mount points at or below dir in this process's
// mount namespace, deepest first.
func MountsUnder(dir string) ([]string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	dir = filepath.Clean(dir)
	var mounts []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		// ID parent major:minor root mount-point options ...
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		p := unescapeMountPath(f[4])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			mounts = append(mounts, p)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	sort.SliceStable(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	return mounts, nil
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
