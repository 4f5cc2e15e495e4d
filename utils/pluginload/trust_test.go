package pluginload

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// trustDir is a plugin directory with one file that is not a Go plugin:
// the checks come before the file is opened.
func trustDir(t *testing.T) (dir, file string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "plugins")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file = filepath.Join(dir, "mod.so")
	if err := os.WriteFile(file, []byte("module bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, file
}

func TestLoadRefusesUntrustedPlugins(t *testing.T) {
	sum := sha256.Sum256([]byte("module bytes"))
	good := hex.EncodeToString(sum[:])
	for _, tt := range []struct {
		name  string
		setup func(t *testing.T, dir, file string) string // returns the dir to load
		pins  Pins
		want  string
	}{
		{"group-writable directory", func(t *testing.T, dir, _ string) string { chmod(t, dir, 0o775); return dir }, nil, "chmod go-w " + "DIR"},
		{"world-writable file", func(t *testing.T, dir, file string) string { chmod(t, file, 0o666); return dir }, nil, "chmod go-w " + "DIR/mod.so"},
		{"writable parent", func(t *testing.T, dir, _ string) string { chmod(t, filepath.Dir(dir), 0o777); return dir }, nil, "above plugin directory"},
		{"symlinked directory", func(t *testing.T, dir, _ string) string {
			link := filepath.Join(filepath.Dir(dir), "link")
			if err := os.Symlink(dir, link); err != nil {
				t.Fatal(err)
			}
			return link
		}, nil, "is a symbolic link"},
		{"symlinked file", func(t *testing.T, dir, file string) string {
			other := filepath.Join(t.TempDir(), "other.so")
			if err := os.WriteFile(other, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(other, filepath.Join(dir, "link.so")); err != nil {
				t.Fatal(err)
			}
			return dir
		}, nil, "link.so is a symbolic link"},
		{"pin mismatch", func(t *testing.T, dir, _ string) string { return dir }, Pins{"mod.so": strings.Repeat("0", 64)}, "it is not the module you pinned"},
		{"unpinned file", func(t *testing.T, dir, _ string) string {
			if err := os.WriteFile(filepath.Join(dir, "extra.so"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			return dir
		}, Pins{"mod.so": good}, "extra.so has no SHA-256 pin"},
		{"pin of a missing module", func(t *testing.T, dir, _ string) string { return dir }, Pins{"mod.so": good, "gone.so": good}, "gone.so: no such module"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir, file := trustDir(t)
			load := tt.setup(t, dir, file)
			_, err := Load(load, tt.pins)
			want := strings.ReplaceAll(tt.want, "DIR", dir)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Load() = %v, want an error containing %q", err, want)
			}
		})
	}
	// A matching pin passes the checks: the file is then opened (and is
	// not a Go plugin).
	dir, _ := trustDir(t)
	if _, err := Load(dir, Pins{"mod.so": strings.ToUpper(good)}); errors.Is(err, ErrUntrusted) {
		t.Errorf("matching pin: %v", err)
	}
}

func TestParsePins(t *testing.T) {
	d := strings.Repeat("ab", 32)
	pins, err := ParsePins([]string{"nvidia.so=" + strings.ToUpper(d)})
	if err != nil || pins["nvidia.so"] != d {
		t.Errorf("ParsePins = %v, %v", pins, err)
	}
	for _, bad := range [][]string{{"nvidia.so"}, {"nvidia=" + d}, {"../x.so=" + d}, {"x.so=abc"}, {"x.so=" + d, "x.so=" + d}} {
		if _, err := ParsePins(bad); err == nil {
			t.Errorf("ParsePins(%q) accepted", bad)
		}
	}
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}
