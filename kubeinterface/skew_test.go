package kubeinterface

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubegpu/kubegpu/types"
)

var updateSkew = flag.Bool("update-skew", false, "rewrite testdata/skew from this version's writer")

// skewKey signs the version-skew fixtures: Ed25519 signatures are
// deterministic, so the fixtures are stable.
func skewKey() *Key {
	return NewEd25519Key(ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize)))
}

func readSkew(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "skew", name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(string(b), "\n")
}

// signExact signs value (a payload without its signature) over its exact
// bytes, as a scheduler of any version from this one on writes it.
func signExact(t *testing.T, k *Key, value string) string {
	t.Helper()
	sig := ed25519.Sign(k.private, []byte(value))
	return value[:len(value)-1] + signatureMember(AlgEd25519+":"+k.ID()+":"+base64.StdEncoding.EncodeToString(sig))
}

// TestSkewFixtures (re)writes the fixtures with -update-skew; otherwise it
// checks that this version's writer still writes the "current" fixture.
func TestSkewFixtures(t *testing.T) {
	k := skewKey()
	signed, err := k.Sign(signedAllocation())
	if err != nil {
		t.Fatal(err)
	}
	current, err := EncodeAllocation(signed)
	if err != nil {
		t.Fatal(err)
	}
	// A newer scheduler's payload: fields this version does not know, at
	// every level, signed over its exact bytes.
	newer := signExact(t, k, `{"apiVersion":"kubegpu.io/v1","kind":"PodAllocation",`+
		`"pod":{"namespace":"default","name":"train","uid":"uid-1","generation":3},`+
		`"node":"node-a","gang":"job-7",`+
		`"containers":[{"name":"main","devices":[{"id":"gpu0","uuid":"GPU-0","exclusive":true,"memoryMiB":16384,"computePercent":100,"migProfile":"7g.80gb"}],"restartPolicy":"Always"}],`+
		`"issuedAt":"2027-01-01T00:00:00Z"}`)
	inventoryNewer := `{"apiVersion":"kubegpu.io/v1","kind":"NodeInventory","devices":[{"id":"gpu0","index":0,"uuid":"GPU-0","vendor":"nvidia.com","model":"NVIDIA A100-SXM4-40GB","memoryMiB":40960,"computeUnits":108,"health":"Healthy","eccErrors":0,"powerLimitW":400}],"links":[],"driver":{"version":"999.1"}}`
	critical := signExact(t, k, `{"apiVersion":"kubegpu.io/v1","kind":"PodAllocation",`+
		`"pod":{"namespace":"default","name":"train","uid":"uid-1"},"node":"node-a",`+
		`"containers":[{"name":"main","devices":[{"id":"gpu0","uuid":"GPU-0","memoryMiB":9856,"computePercent":14,"migProfile":"1g.10gb"}]}],`+
		`"critical":["migProfile"]}`)
	fixtures := map[string]string{
		"allocation-newer-critical.json":  critical,
		"allocation-current.json":         current,
		"allocation-newer.json":           newer,
		"inventory-newer.json":            inventoryNewer,
		"allocation-next-apiversion.json": strings.Replace(newer, "kubegpu.io/v1", "kubegpu.io/v2", 1),
	}
	for name, value := range fixtures {
		path := filepath.Join("testdata", "skew", name)
		if *updateSkew {
			if err := os.WriteFile(path, []byte(value+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if name == "allocation-current.json" && readSkew(t, name) != value {
			t.Errorf("this version writes allocations that differ from %s: an older node re-encodes what it knows and would refuse them; if the change is intended, document the skew and run with -update-skew", path)
		}
	}
}

// TestSkewNewerSchedulerOlderNode: this version, as a node or as the
// scheduler's cache, reads a newer scheduler's allocation: it verifies over
// the exact bytes, ignores the fields it does not know, and writes the
// value back unchanged.
func TestSkewNewerSchedulerOlderNode(t *testing.T) {
	value := readSkew(t, "allocation-newer.json")
	a, err := DecodeAllocation(value)
	if err != nil {
		t.Fatalf("DecodeAllocation(newer) = %v", err)
	}
	if err := NewKeySet(skewKey().Public()).Verify(a); err != nil {
		t.Fatalf("Verify(newer) = %v, want nil: a newer scheduler's fields must not break the signature", err)
	}
	if a.Node != "node-a" || a.Pod.UID != "uid-1" || len(a.Containers) != 1 || a.Containers[0].Devices[0].UUID != "GPU-0" {
		t.Errorf("decoded %+v, want the known fields of the fixture", a)
	}
	if again, err := EncodeAllocation(a); err != nil || again != value {
		t.Errorf("EncodeAllocation(decoded) = %.80q, %v; want the value read, unchanged", again, err)
	}
	// The signature still binds every field, known or not.
	for _, tamper := range []struct{ from, to string }{
		{`"gang":"job-7"`, `"gang":"job-8"`},
		{`"migProfile":"7g.80gb"`, `"migProfile":"1g.10gb"`},
		{`"uuid":"GPU-0"`, `"uuid":"GPU-1"`},
		{`"node":"node-a"`, `"node":"node-b"`},
	} {
		changed := strings.Replace(value, tamper.from, tamper.to, 1)
		b, err := DecodeAllocation(changed)
		if err != nil {
			t.Fatalf("DecodeAllocation(%s) = %v", tamper.to, err)
		}
		if err := NewKeySet(skewKey().Public()).Verify(b); !errors.Is(err, ErrBadSignature) {
			t.Errorf("Verify with %s = %v, want ErrBadSignature", tamper.to, err)
		}
	}
	// Known fields changed after decoding are not covered by the bytes read.
	a.Node = "node-b"
	if err := NewKeySet(skewKey().Public()).Verify(a); !errors.Is(err, ErrBadSignature) {
		t.Errorf("Verify after changing the decoded node = %v, want ErrBadSignature", err)
	}
}

// legacyVerify is how versions before exact-bytes verification checked a
// signature: over the decoded allocation encoded again.
func legacyVerify(s *KeySet, value string) error {
	a, err := DecodeAllocation(value)
	if err != nil {
		return err
	}
	a.signed, a.known = nil, nil
	return s.Verify(a)
}

// TestSkewOlderSchedulerNewerNode and the reverse: what this version writes
// verifies on nodes that re-encode (the version before it), and what that
// version wrote verifies here.
func TestSkewOlderScheduler(t *testing.T) {
	keys := NewKeySet(skewKey().Public())
	value := readSkew(t, "allocation-current.json")
	if err := legacyVerify(keys, value); err != nil {
		t.Errorf("an older node's check of this version's allocation = %v, want nil", err)
	}
	a, err := DecodeAllocation(value)
	if err != nil {
		t.Fatal(err)
	}
	if err := keys.Verify(a); err != nil {
		t.Errorf("Verify(older scheduler's allocation) = %v, want nil", err)
	}
	// Signed before key IDs.
	noID, err := skewKey().SignWithoutKeyID(a)
	if err != nil {
		t.Fatal(err)
	}
	encoded, err := EncodeAllocation(noID)
	if err != nil {
		t.Fatal(err)
	}
	if err := legacyVerify(keys, encoded); err != nil {
		t.Errorf("legacy check of a signature without key ID = %v", err)
	}
	// A newer scheduler's extra fields are what an older, re-encoding node
	// cannot verify: why nodes are upgraded before the scheduler.
	if err := legacyVerify(keys, readSkew(t, "allocation-newer.json")); !errors.Is(err, ErrBadSignature) {
		t.Errorf("re-encoding check of a newer allocation = %v, want ErrBadSignature", err)
	}
}

// TestSkewCriticalFields: a newer scheduler's field that changes what a
// container may get, listed as critical, makes this version refuse the
// allocation rather than ignore the field.
func TestSkewCriticalFields(t *testing.T) {
	_, err := DecodeAllocation(readSkew(t, "allocation-newer-critical.json"))
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "migProfile") || !strings.Contains(err.Error(), "newer") {
		t.Errorf("DecodeAllocation(critical migProfile) = %v, want a refusal naming the field", err)
	}
}

func TestSkewInventoryAndVersions(t *testing.T) {
	inv, err := DecodeInventory(readSkew(t, "inventory-newer.json"))
	if err != nil {
		t.Fatalf("DecodeInventory(newer) = %v, want the fields it does not know ignored", err)
	}
	if len(inv.Devices) != 1 || inv.Devices[0].Vendor != types.VendorNVIDIA {
		t.Errorf("decoded %+v", inv)
	}
	_, err = DecodeAllocation(readSkew(t, "allocation-next-apiversion.json"))
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "kubegpu.io/v2") || !strings.Contains(err.Error(), "upgrade") {
		t.Errorf("DecodeAllocation(kubegpu.io/v2) = %v, want a clear refusal naming the version", err)
	}
	// Re-formatted: the signature is no longer the last member.
	value := readSkew(t, "allocation-current.json")
	if _, err := DecodeAllocation(value + " "); err == nil {
		t.Errorf("DecodeAllocation(re-formatted) = nil, want an error")
	}
}

// TestSignatureNotMalleable: the unused bits of the signature's last
// base64 character are not free to change: each signature has one spelling,
// so a pod's annotation cannot be rewritten to another string that verifies.
func TestSignatureNotMalleable(t *testing.T) {
	value := readSkew(t, "allocation-current.json")
	i := strings.LastIndex(value, `=="}`) - 1
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	v := strings.IndexByte(alphabet, value[i])
	if i < 0 || v < 0 {
		t.Fatalf("fixture's signature does not end in a padded base64 character: %q", value[max(0, i-4):])
	}
	changed := value[:i] + string(alphabet[v^1]) + value[i+1:]
	a, err := DecodeAllocation(changed)
	if err != nil {
		t.Fatal(err)
	}
	if err := NewKeySet(skewKey().Public()).Verify(a); !errors.Is(err, ErrBadSignature) {
		t.Errorf("Verify with the signature's padding bits changed = %v, want ErrBadSignature", err)
	}
}
