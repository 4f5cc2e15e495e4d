package main

import (
	"errors"
	"fmt"
	"io"
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
// killed: directories of this user, as MkdirTemp makes them (0700, no
// link), whose pid file, a small regular file, names no live process.
// Anything else under the pattern is left alone: the temporary directory
// is shared with other users.
func removeAbandoned(tmp string) {
	dirs, _ := filepath.Glob(filepath.Join(tmp, demoDirPattern+"*"))
	for _, dir := range dirs {
		pid, ok := abandonedPid(dir)
		if !ok || alive(pid) {
			continue
		}
		if err := os.RemoveAll(dir); err == nil {
			fmt.Printf("removed %q (left by a demo run that was killed)\n", dir)
		}
	}
}

// abandonedPid reads the pid file of dir, if dir is a demo directory of
// this user.
func abandonedPid(dir string) (int, bool) {
	info, err := os.Lstat(dir)
	if err != nil || !info.IsDir() || info.Mode().Perm() != 0o700 {
		return 0, false
	}
	if st, ok := info.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Getuid() {
		return 0, false
	}
	f, err := os.OpenFile(filepath.Join(dir, pidFile), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return 0, false // ended, or not a demo's
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return 0, false
	}
	b := make([]byte, 32)
	n, _ := io.ReadFull(f, b)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, true
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
