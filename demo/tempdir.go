package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// The demo's directory holds the cluster CA's and the allocation signing
// key's private keys: no run leaves them behind. A run that ends keeps
// nothing; one that fails keeps its logs alone; one killed outright (no
// teardown) leaves its directory with a pid file, which the next run
// removes once that process is gone.

const (
	demoDirPattern = "kubegpu-demo-"
	pidFile        = "demo.pid"
)

// makeDemoDir removes what killed runs left and makes this run's
// directory, with its pid file.
func makeDemoDir() (string, error) {
	removeAbandoned(os.TempDir())
	dir, err := os.MkdirTemp("", demoDirPattern)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, pidFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return "", err
	}
	return dir, nil
}

// removeAbandoned removes the demo directories under tmp whose run was
// killed: they still have a pid file, and no process has that pid.
func removeAbandoned(tmp string) {
	dirs, _ := filepath.Glob(filepath.Join(tmp, demoDirPattern+"*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, pidFile))
		if err != nil {
			continue // ended, or not a demo's
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || alive(pid) {
			continue
		}
		if err := os.RemoveAll(dir); err == nil {
			fmt.Println("removed", dir, "(left by a demo run that was killed)")
		}
	}
}

// alive reports whether a process pid exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// keepLogs removes everything in dir but the logs (*.log): keys,
// certificates, kubeconfigs, etcd's data and the pid file.
func keepLogs(dir string) error {
	var errs []error
	var dirs []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			errs = append(errs, err)
		case d.IsDir():
			dirs = append(dirs, path)
		case !strings.HasSuffix(d.Name(), ".log"):
			errs = append(errs, os.Remove(path))
		}
		return nil
	})
	// Directories left empty go, deepest first.
	for i := len(dirs) - 1; i > 0; i-- {
		_ = os.Remove(dirs[i])
	}
	return errors.Join(append(errs, err)...)
}
