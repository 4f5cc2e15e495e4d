package plugin

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSharedKeyFile: the key file may be read by the scheduler's own group
// (a Secret volume with fsGroup), not by others or another group.
func TestSharedKeyFile(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		mode   os.FileMode
		gid    int
		shared bool
	}{
		{0o600, os.Getegid(), false},
		{0o640, os.Getegid(), false},
		{0o440, os.Getegid(), false},
		{0o644, os.Getegid(), true},
		{0o640, os.Getegid() + 1, true},
	} {
		p := filepath.Join(dir, "key.pem")
		if err := os.WriteFile(p, []byte("k"), c.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, c.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, -1, c.gid); err != nil {
			t.Skipf("chown: %v", err)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := sharedKeyFile(fi); got != c.shared {
			t.Errorf("mode %v, group %d: shared = %v, want %v", c.mode, c.gid, got, c.shared)
		}
		os.Remove(p)
	}
}
