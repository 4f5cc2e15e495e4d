package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// TestKeepLogs: a failed run keeps its logs and nothing else.
func TestKeepLogs(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"ca.key": "k", "kube-apiserver.log": "l", "identities/x.kubeconfig": "c",
		"identities/x.key": "k", "etcd/member/wal": "w", "node/kubelet.log": "l", pidFile: "1"} {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := keepLogs(dir); err != nil {
		t.Fatal(err)
	}
	var left []string
	_ = filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err == nil && path != dir {
			rel, _ := filepath.Rel(dir, path)
			left = append(left, rel)
		}
		return nil
	})
	want := map[string]bool{"kube-apiserver.log": true, "node": true, "node/kubelet.log": true}
	if len(left) != len(want) {
		t.Fatalf("left %v, want the logs alone", left)
	}
	for _, l := range left {
		if !want[l] {
			t.Errorf("left %s", l)
		}
	}
}

// TestRemoveAbandoned: the directory of a killed run (pid file, process
// gone) is removed; a running one's and one without a pid file stay.
func TestRemoveAbandoned(t *testing.T) {
	tmp := t.TempDir()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	gone := cmd.Process.Pid // reaped: no such process (unless reused at once)
	for name, pid := range map[string]string{"killed": strconv.Itoa(gone), "running": strconv.Itoa(os.Getpid()), "ended": "",
		"open": strconv.Itoa(gone), "fifo": "", "link": ""} {
		dir := filepath.Join(tmp, demoDirPattern+name)
		mode := os.FileMode(0o700)
		if name == "open" {
			mode = 0o755 // not as MkdirTemp makes it: someone else's doing
		}
		if err := os.Mkdir(dir, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		if pid != "" {
			if err := os.WriteFile(filepath.Join(dir, pidFile), []byte(pid), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A pid file that is a FIFO or a link is never read: reading would
	// block, or read another file.
	if err := syscall.Mkfifo(filepath.Join(tmp, demoDirPattern+"fifo", pidFile), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", filepath.Join(tmp, demoDirPattern+"link", pidFile)); err != nil {
		t.Fatal(err)
	}
	removeAbandoned(tmp)
	for name, want := range map[string]bool{"killed": false, "running": true, "ended": true, "open": true, "fifo": true, "link": true} {
		if _, err := os.Stat(filepath.Join(tmp, demoDirPattern+name)); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", name, err == nil, want)
		}
	}
}
