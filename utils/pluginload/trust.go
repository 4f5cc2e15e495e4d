package pluginload

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// ErrUntrusted is wrapped when the plugin directory, one of its parents or
// a plugin file could be changed by someone other than the host's owner
// (root), or a file does not match its pin. A module runs with the host's
// privileges: as root in kubegpu-crishim, beside the signing key in
// kubegpu-scheduler.
var ErrUntrusted = errors.New("untrusted plugin")

// Pins are the expected SHA-256 digests of module files, by file name
// ("nvidia.so": hex digest). When any is set, every module file must have
// one.
type Pins map[string]string

// ParsePins parses flags of the form FILE=SHA256 ("nvidia.so=9f86d0...").
func ParsePins(flags []string) (Pins, error) {
	pins := Pins{}
	for _, f := range flags {
		name, digest, ok := strings.Cut(f, "=")
		if !ok || name == "" || strings.ContainsRune(name, '/') || !strings.HasSuffix(name, ".so") {
			return nil, fmt.Errorf("plugin pin %q: want FILE.so=SHA256 (sha256sum FILE.so)", f)
		}
		if err := checkDigest(digest); err != nil {
			return nil, fmt.Errorf("plugin pin %q: %w", f, err)
		}
		if _, dup := pins[name]; dup {
			return nil, fmt.Errorf("plugin pin for %s is set twice", name)
		}
		pins[name] = strings.ToLower(digest)
	}
	return pins, nil
}

func checkDigest(d string) error {
	if b, err := hex.DecodeString(d); err != nil || len(b) != sha256.Size {
		return fmt.Errorf("%q is not a SHA-256 digest (64 hex digits)", d)
	}
	return nil
}

// checkDir checks the plugin directory and every directory above it: real
// directories (no symbolic link on the way), owned by root or the host's
// user, writable by no one else (a parent may be world-writable with the
// sticky bit, like /tmp, which keeps others from renaming what they do not
// own).
func checkDir(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("plugin directory %s: %w", dir, err)
	}
	for p := abs; ; p = filepath.Dir(p) {
		fi, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("plugin directory %s: %w", dir, err)
		}
		what := "plugin directory " + p
		if p != abs {
			what = fmt.Sprintf("%s, above plugin directory %s,", p, abs)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%w: %s is a symbolic link; give the plugin directory by its real path", ErrUntrusted, what)
		}
		if !fi.IsDir() {
			return fmt.Errorf("plugin directory %s: %s is not a directory", dir, p)
		}
		sticky := p != abs && fi.Mode()&fs.ModeSticky != 0
		if err := checkOwner(what, p, fi, sticky); err != nil {
			return err
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// checkOwner checks that fi is owned by root or the host's user and, unless
// allowSticky, writable by no one else.
func checkOwner(what, path string, fi fs.FileInfo, allowSticky bool) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: cannot read its owner", what)
	}
	if euid := uint32(os.Geteuid()); st.Uid != 0 && st.Uid != euid {
		return fmt.Errorf("%w: %s is owned by uid %d, not root: chown root %s", ErrUntrusted, what, st.Uid, path)
	}
	if fi.Mode().Perm()&0o022 != 0 && !allowSticky {
		return fmt.Errorf("%w: %s is writable by its group or others (%s): anyone there could replace the code the host runs; chmod go-w %s",
			ErrUntrusted, what, fi.Mode(), path)
	}
	return nil
}

// checkFile checks one module file: a regular file (not a symbolic link)
// with the directory's ownership rules, and its pin if pins are set.
func checkFile(path string, pins Pins) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("plugin %s: %w", path, err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("%w: plugin %s is a symbolic link; copy the module into the plugin directory", ErrUntrusted, path)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("plugin %s: not a regular file", path)
	}
	if err := checkOwner("plugin "+path, path, fi, false); err != nil {
		return err
	}
	if len(pins) == 0 {
		return nil
	}
	want, ok := pins[filepath.Base(path)]
	if !ok {
		return fmt.Errorf("%w: plugin %s has no SHA-256 pin, and pins are set for %s: pin it or remove it",
			ErrUntrusted, path, strings.Join(sortedKeys(pins), ", "))
	}
	got, err := fileSHA256(path)
	if err != nil {
		return fmt.Errorf("plugin %s: %w", path, err)
	}
	if want = strings.ToLower(want); got != want {
		return fmt.Errorf("%w: plugin %s has SHA-256 %s, pinned %s: it is not the module you pinned", ErrUntrusted, path, got, want)
	}
	return nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func sortedKeys(m Pins) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
