package kubeinterface

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"flag"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"filippo.io/edwards25519"

	"github.com/kubegpu/kubegpu/types"
)

func signedAllocation() Allocation {
	return Allocation{
		Pod: PodRef{Namespace: "ml", Name: "train", UID: "0b6d3c5e"},
		PodAllocation: types.PodAllocation{Node: "gpu-node-1", Containers: []types.ContainerAllocation{{
			Name: "main", Devices: []types.DeviceShare{{ID: "gpu0", UUID: "GPU-1", Exclusive: true}},
		}}},
	}
}

func ed25519Files(t testing.TB) (privPath, pubPath string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	privDER, _ := x509.MarshalPKCS8PrivateKey(priv)
	pubDER, _ := x509.MarshalPKIXPublicKey(pub)
	dir := t.TempDir()
	privPath, pubPath = filepath.Join(dir, "key.pem"), filepath.Join(dir, "pub.pem")
	if err := os.WriteFile(privPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return privPath, pubPath
}

func hmacFile(t testing.TB, secret string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secret.pem")
	if err := os.WriteFile(path, EncodeHMACSecret([]byte(secret)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestSignAndVerify(t *testing.T) {
	privPath, pubPath := ed25519Files(t)
	hmacPath := hmacFile(t, "0123456789abcdef0123456789abcdef")
	for _, tt := range []struct{ name, signer, verifier, alg string }{
		{"ed25519 private signs, public verifies", privPath, pubPath, AlgEd25519},
		{"hmac shared secret", hmacPath, hmacPath, AlgHMACSHA256},
	} {
		t.Run(tt.name, func(t *testing.T) {
			signer, err := LoadSigningKey(tt.signer)
			if err != nil {
				t.Fatal(err)
			}
			verifier, err := LoadVerifyKeys(tt.verifier)
			if err != nil {
				t.Fatal(err)
			}
			signed, err := signer.Sign(signedAllocation())
			if err != nil {
				t.Fatal(err)
			}
			if want := tt.alg + ":" + signer.ID() + ":"; !strings.HasPrefix(signed.Signature, want) || len(signer.ID()) != 16 {
				t.Errorf("signature %q, want prefix %s", signed.Signature, want)
			}
			if SignatureKeyID(signed.Signature) != signer.ID() {
				t.Errorf("SignatureKeyID = %q, want %q", SignatureKeyID(signed.Signature), signer.ID())
			}
			// Through the annotation and back.
			value, err := EncodeAllocation(signed)
			if err != nil {
				t.Fatal(err)
			}
			decoded, err := DecodeAllocation(value)
			if err != nil {
				t.Fatal(err)
			}
			if err := verifier.Verify(decoded); err != nil {
				t.Errorf("Verify(signed) = %v", err)
			}
			// A signature made before key IDs verifies against the keys of its algorithm.
			legacy, err := signer.SignWithoutKeyID(decoded)
			if err != nil {
				t.Fatal(err)
			}
			if want := tt.alg + ":" + strings.SplitN(decoded.Signature, ":", 3)[2]; legacy.Signature != want {
				t.Errorf("SignWithoutKeyID = %q, want %q", legacy.Signature, want)
			}
			if err := verifier.Verify(legacy); err != nil {
				t.Errorf("Verify(signature without key ID) = %v", err)
			}
			// Every field the signature binds.
			for what, change := range map[string]func(a *Allocation){
				"namespace": func(a *Allocation) { a.Pod.Namespace = "other" },
				"name":      func(a *Allocation) { a.Pod.Name = "other" },
				"uid":       func(a *Allocation) { a.Pod.UID = "other" },
				"node":      func(a *Allocation) { a.Node = "other" },
				"device":    func(a *Allocation) { a.Containers[0].Devices[0].UUID = "GPU-2" },
				"share":     func(a *Allocation) { a.Containers[0].Devices[0].Exclusive = false },
				"unsigned":  func(a *Allocation) { a.Signature = "" },
				"garbage":   func(a *Allocation) { a.Signature = tt.alg + ":" + signer.ID() + ":!!" },
				"no alg":    func(a *Allocation) { a.Signature = "abc" },
				"other id":  func(a *Allocation) { a.Signature = strings.Replace(a.Signature, signer.ID(), "0000000000000000", 1) },
				"other alg": func(a *Allocation) { a.Signature = strings.Replace(a.Signature, tt.alg, "rsa", 1) },
			} {
				changed := decoded
				changed.Containers = []types.ContainerAllocation{{Name: "main", Devices: append([]types.DeviceShare(nil), decoded.Containers[0].Devices...)}}
				change(&changed)
				if err := verifier.Verify(changed); !errors.Is(err, ErrBadSignature) {
					t.Errorf("Verify with a changed %s = %v, want ErrBadSignature", what, err)
				}
			}
		})
	}
}

// TestKeyRotation: a verifier holding the old and the new public key
// accepts allocations signed by either, and by neither once the old key
// is retired.
func TestKeyRotation(t *testing.T) {
	oldPriv, oldPub := ed25519Files(t)
	newPriv, newPub := ed25519Files(t)
	oldKey, _ := LoadSigningKey(oldPriv)
	newKey, _ := LoadSigningKey(newPriv)
	both := filepath.Join(t.TempDir(), "both.pem")
	a, _ := os.ReadFile(oldPub)
	b, _ := os.ReadFile(newPub)
	if err := os.WriteFile(both, append(append(a, []byte("# the key being retired\n")...), b...), 0o644); err != nil {
		t.Fatal(err)
	}
	set, err := LoadVerifyKeys(both)
	if err != nil || set.Len() != 2 {
		t.Fatalf("LoadVerifyKeys: %v, %d keys", err, set.Len())
	}
	byOld, _ := oldKey.Sign(signedAllocation())
	byNew, _ := newKey.Sign(signedAllocation())
	for _, s := range []Allocation{byOld, byNew} {
		if err := set.Verify(s); err != nil {
			t.Errorf("set of both: %v", err)
		}
	}
	retired, _ := LoadVerifyKeys(newPub)
	if err := retired.Verify(byOld); !errors.Is(err, ErrBadSignature) || !strings.Contains(err.Error(), "signed with key "+oldKey.ID()+", which is not among the keys held here (ed25519:"+newKey.ID()+")") {
		t.Errorf("old signature after the old key is retired: %v", err)
	}
}

func TestKeyFileErrors(t *testing.T) {
	privPath, pubPath := ed25519Files(t)
	pub, err := LoadVerifyKeys(pubPath)
	if err != nil {
		t.Fatal(err)
	}
	if pub.HasHMAC() {
		t.Error("an Ed25519 public key counted as HMAC")
	}
	// The scheduler needs a key that signs; a node refuses one.
	if _, err := LoadSigningKey(pubPath); err == nil || !strings.Contains(err.Error(), "an Ed25519 public key cannot sign") {
		t.Errorf("LoadSigningKey(public) = %v", err)
	}
	if _, err := LoadVerifyKeys(privPath); err == nil || !strings.Contains(err.Error(), "holds a private key") || !strings.Contains(err.Error(), "openssl pkey") {
		t.Errorf("LoadVerifyKeys(private) = %v", err)
	}
	hmacPath := hmacFile(t, strings.Repeat("k", MinHMACKeyBytes))
	if set, err := LoadVerifyKeys(hmacPath); err != nil || !set.HasHMAC() {
		t.Errorf("LoadVerifyKeys(hmac) = %v", err)
	}
	// An HMAC-signed allocation is refused by an Ed25519 verifier.
	hmacKey, _ := LoadSigningKey(hmacPath)
	signed, _ := hmacKey.Sign(signedAllocation())
	if err := pub.Verify(signed); !errors.Is(err, ErrBadSignature) {
		t.Errorf("Ed25519 key verifying an HMAC signature: %v", err)
	}
	pubPEM, _ := os.ReadFile(pubPath)
	block, _ := pem.Decode(pubPEM)
	kubeconfig := "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    server: https://10.0.0.1:6443\n  name: c\nusers:\n- name: u\n  user:\n    token: " + strings.Repeat("t", 40) + "\n"
	for _, tt := range []struct{ name, data, want string }{
		{"bare secret", strings.Repeat("s", 64), "a bare HMAC secret is no longer accepted"},
		{"DER public key", string(block.Bytes), "not a PEM key file"},
		{"kubeconfig", kubeconfig, "not a PEM key file"},
		{"empty", " \n", "empty"},
		{"short secret", string(EncodeHMACSecret([]byte("too short"))), "9 bytes is too short"},
		{"other PEM", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", `PEM block "CERTIFICATE"`},
		{"bad PKCS8", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "parse PKCS #8 private key"},
		{"damaged PEM", "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEI", "1 PEM blocks but 0 decode"},
		{"damaged block before a good one", "-----BEGIN PUBLIC KEY-----\n!!!\n-----END PUBLIC KEY-----\n" + string(pubPEM), "2 PEM blocks but 1 decode"},
		{"OpenSSH key", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl user@host", "OpenSSH key"},
		{"too many", strings.Repeat(string(pubPEM), MaxKeysPerFile+1), "more than 16 keys"},
	} {
		path := filepath.Join(t.TempDir(), "key")
		if err := os.WriteFile(path, []byte(tt.data), 0o600); err != nil {
			t.Fatal(err)
		}
		for loader, load := range map[string]func(string) error{
			"LoadSigningKey": func(p string) error { _, err := LoadSigningKey(p); return err },
			"LoadVerifyKeys": func(p string) error { _, err := LoadVerifyKeys(p); return err },
		} {
			if err := load(path); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%s: %s() = %v, want an error containing %q", tt.name, loader, err, tt.want)
			}
		}
	}
	if _, err := LoadVerifyKeys(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("LoadVerifyKeys of a missing file succeeded")
	}
}

func FuzzVerify(f *testing.F) {
	key, err := NewHMACKey([]byte(strings.Repeat("s", MinHMACKeyBytes)))
	if err != nil {
		f.Fatal(err)
	}
	signed, _ := key.Sign(signedAllocation())
	f.Add(signed.Signature)
	f.Add("ed25519:AAAA")
	f.Add("hmac-sha256:" + key.ID() + ":")
	f.Add(":")
	f.Fuzz(func(t *testing.T, sig string) {
		a := signedAllocation()
		a.Signature = sig
		err := key.Verify(a)
		if sig == signed.Signature {
			if err != nil {
				t.Fatalf("Verify(good) = %v", err)
			}
			return
		}
		if err != nil && !errors.Is(err, ErrBadSignature) {
			t.Fatalf("Verify(%q) = %v, want ErrBadSignature", sig, err)
		}
	})
}

func FuzzParseKeys(f *testing.F) {
	privPath, pubPath := ed25519Files(f)
	for _, p := range []string{privPath, pubPath} {
		b, _ := os.ReadFile(p)
		f.Add(b)
	}
	f.Add(EncodeHMACSecret([]byte(strings.Repeat("x", 40))))
	f.Add([]byte(strings.Repeat("x", 40)))
	f.Fuzz(func(t *testing.T, data []byte) {
		keys, err := ParseKeys(data)
		if err != nil {
			return
		}
		if len(keys) == 0 || len(keys) > MaxKeysPerFile {
			t.Fatalf("%d keys without an error", len(keys))
		}
		for _, k := range keys {
			if !k.CanSign() {
				continue
			}
			signed, err := k.Sign(signedAllocation())
			if err != nil {
				t.Fatal(err)
			}
			if err := NewKeySet(k.Public()).Verify(signed); err != nil {
				t.Fatalf("a key does not verify its own signature: %v", err)
			}
		}
	})
}

// smallOrderEncodings returns every 32-byte encoding of a point of small
// order that Ed25519 verification decodes: the eight points of the 8-torsion
// subgroup, derived here (not copied from a list), each with its sign bit
// flipped and with y+p where that fits.
func smallOrderEncodings(t *testing.T) [][]byte {
	t.Helper()
	// The torsion part of any point P is [L]P = [L-1]P + P.
	one, err := edwards25519.NewScalar().SetCanonicalBytes(append([]byte{1}, make([]byte, 31)...))
	if err != nil {
		t.Fatal(err)
	}
	minusOne := edwards25519.NewScalar().Negate(one)
	identity := edwards25519.NewIdentityPoint()
	var gen *edwards25519.Point
	for seed := 0; gen == nil && seed < 256; seed++ {
		var b [32]byte
		b[0], b[1] = byte(seed), 0x5a
		p, err := new(edwards25519.Point).SetBytes(b[:])
		if err != nil {
			continue
		}
		q := new(edwards25519.Point).ScalarMult(minusOne, p)
		q.Add(q, p)
		four := new(edwards25519.Point).Add(q, q)
		four.Add(four, four)
		if four.Equal(identity) == 0 { // of order 8
			gen = q
		}
	}
	if gen == nil {
		t.Fatal("no point of order 8 found")
	}
	var out [][]byte
	seen := map[string]bool{}
	add := func(b []byte) {
		if _, err := new(edwards25519.Point).SetBytes(b); err == nil && !seen[string(b)] {
			seen[string(b)] = true
			out = append(out, b)
		}
	}
	p := edwards25519.NewIdentityPoint()
	for range 8 {
		enc := p.Bytes()
		add(enc)
		flipped := slices.Clone(enc)
		flipped[31] ^= 0x80
		add(flipped)
		// y+p, where y+p < 2^255 (y < 19): the non-canonical encoding.
		y := new(big.Int).SetBytes(reverse(append(slices.Clone(enc[:31]), enc[31]&0x7f)))
		if y.Cmp(big.NewInt(19)) < 0 {
			yp := y.Add(y, new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 255), big.NewInt(19)))
			nc := reverse(yp.FillBytes(make([]byte, 32)))
			nc[31] |= enc[31] & 0x80
			add(nc)
			nc = slices.Clone(nc)
			nc[31] ^= 0x80
			add(nc)
		}
		p.Add(p, gen)
	}
	if len(out) < 8 {
		t.Fatalf("%d small-order encodings, want at least the 8 points", len(out))
	}
	return out
}

func reverse(b []byte) []byte {
	slices.Reverse(b)
	return b
}

// TestSmallOrderPublicKeysRefused: with a public key of small order (the
// identity, all zeros, ...), a signature made without any private key
// verifies; every such key is refused where keys are loaded, saying why.
func TestSmallOrderPublicKeysRefused(t *testing.T) {
	// The attack the check stops: the identity as the key, R = identity,
	// S = 0, for any message.
	forged := append(edwards25519.NewIdentityPoint().Bytes(), make([]byte, 32)...)
	if !ed25519.Verify(edwards25519.NewIdentityPoint().Bytes(), []byte("any allocation"), forged) {
		t.Fatal("the forged signature does not verify with the identity key: the test shows nothing")
	}
	for _, enc := range smallOrderEncodings(t) {
		der, err := x509.MarshalPKIXPublicKey(ed25519.PublicKey(enc))
		if err != nil {
			t.Fatal(err)
		}
		data := pem.EncodeToMemory(&pem.Block{Type: PEMPublicKey, Bytes: der})
		if _, err := ParseKeys(data); !errors.Is(err, ErrWeakKey) {
			t.Errorf("public key %x: ParseKeys = %v, want ErrWeakKey", enc, err)
		}
		path := filepath.Join(t.TempDir(), "pub.pem")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadVerifyKeys(path); err == nil || !strings.Contains(err.Error(), "small order") {
			t.Errorf("public key %x: LoadVerifyKeys = %v, want a refusal that says why", enc, err)
		}
	}
	// Real keys load, and 32 bytes that are no point are refused too.
	_, pubPath := ed25519Files(t)
	if _, err := LoadVerifyKeys(pubPath); err != nil {
		t.Errorf("a real public key: %v", err)
	}
	var notAPoint []byte
	for seed := range 256 {
		b := bytes.Repeat([]byte{0x5a}, 32)
		b[0] = byte(seed)
		if _, err := new(edwards25519.Point).SetBytes(b); err != nil {
			notAPoint = b
			break
		}
	}
	der, _ := x509.MarshalPKIXPublicKey(ed25519.PublicKey(notAPoint))
	if _, err := ParseKeys(pem.EncodeToMemory(&pem.Block{Type: PEMPublicKey, Bytes: der})); err == nil || !strings.Contains(err.Error(), "not a point") {
		t.Errorf("a public key that is no point: %v", err)
	}
}

var updateGolden = flag.Bool("update", false, "rewrite the chart's list of small-order keys")

// chartWeakKeys is the Helm chart's list of the small-order public keys,
// which its nodesPublicKey check refuses (templates/publickey.yaml).
const chartWeakKeys = "../deploy/helm/kubegpu/templates/_weakkeys.tpl"

// TestChartWeakKeys: the chart refuses the same small-order keys as
// ParseKeys: its list is the base64 of each one's PKIX encoding, as it
// stands in a PEM block (go test ./kubeinterface -update rewrites it).
func TestChartWeakKeys(t *testing.T) {
	var b strings.Builder
	b.WriteString("{{- /* Generated by kubeinterface's TestChartWeakKeys (go test ./kubeinterface -update):\n" +
		"the Ed25519 public keys of small order, base64 of their PKIX encoding, as in a PEM block. */ -}}\n" +
		"{{- define \"kubegpu.weakPublicKeys\" -}}\n")
	for i, enc := range smallOrderEncodings(t) {
		der, err := x509.MarshalPKIXPublicKey(ed25519.PublicKey(enc))
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString(base64.StdEncoding.EncodeToString(der))
	}
	b.WriteString("\n{{- end -}}\n")
	if *updateGolden {
		if err := os.WriteFile(chartWeakKeys, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(chartWeakKeys)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != b.String() {
		t.Errorf("%s is not the list of small-order keys: run go test ./kubeinterface -update", chartWeakKeys)
	}
}
