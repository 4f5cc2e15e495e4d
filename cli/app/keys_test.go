package app

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubegpu/kubegpu/kubeinterface"
)

// TestWrapHMAC: an earlier version's bare secret, with white space inside
// (base64 wraps at 76 columns) and around it, wraps into a PEM file of the
// same key: signatures made with the old secret verify.
func TestWrapHMAC(t *testing.T) {
	dir := t.TempDir()
	bare := "  " + strings.Repeat("A", 76) + "\n" + strings.Repeat("B", 12) + "\n\n"
	old := filepath.Join(dir, "secret")
	if err := os.WriteFile(old, []byte(bare), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	cmd := NewCommand(context.Background(), &out, &errOut)
	cmd.SetArgs([]string{"keys", "wrap-hmac", old})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("wrap-hmac: %v: %s", err, errOut.String())
	}
	wrapped := filepath.Join(dir, "secret.pem")
	if err := os.WriteFile(wrapped, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	before, err := kubeinterface.NewHMACKey([]byte(strings.TrimSpace(bare)))
	if err != nil {
		t.Fatal(err)
	}
	after, err := kubeinterface.LoadVerifyKeys(wrapped)
	if err != nil {
		t.Fatal(err)
	}
	signed, _ := before.Sign(kubeinterface.Allocation{Pod: kubeinterface.PodRef{Namespace: "a", Name: "b", UID: "c"}})
	if err := after.Verify(signed); err != nil {
		t.Errorf("the wrapped key does not verify the old secret's signatures: %v", err)
	}
	if !strings.Contains(errOut.String(), before.ID()) {
		t.Errorf("wrap-hmac printed %q, want the key ID %s", errOut.String(), before.ID())
	}

	out.Reset()
	cmd = NewCommand(context.Background(), &out, &errOut)
	cmd.SetArgs([]string{"keys", "id", wrapped})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if want := "hmac-sha256:" + before.ID() + "\tshared HMAC secret"; !strings.Contains(out.String(), want) {
		t.Errorf("keys id printed %q, want %q", out.String(), want)
	}
}
