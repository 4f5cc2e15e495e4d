package kubeinterface

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

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

func TestSignAndVerify(t *testing.T) {
	privPath, pubPath := ed25519Files(t)
	hmacPath := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(hmacPath, []byte("  0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, signer, verifier, alg string }{
		{"ed25519 private signs, public verifies", privPath, pubPath, AlgEd25519},
		{"hmac shared secret", hmacPath, hmacPath, AlgHMACSHA256},
	} {
		t.Run(tt.name, func(t *testing.T) {
			signer, err := LoadKey(tt.signer)
			if err != nil {
				t.Fatal(err)
			}
			verifier, err := LoadKey(tt.verifier)
			if err != nil {
				t.Fatal(err)
			}
			signed, err := signer.Sign(signedAllocation())
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(signed.Signature, tt.alg+":") {
				t.Errorf("signature %q, want prefix %s:", signed.Signature, tt.alg)
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
			// Every field the signature binds.
			for what, change := range map[string]func(a *Allocation){
				"namespace": func(a *Allocation) { a.Pod.Namespace = "other" },
				"name":      func(a *Allocation) { a.Pod.Name = "other" },
				"uid":       func(a *Allocation) { a.Pod.UID = "other" },
				"node":      func(a *Allocation) { a.Node = "other" },
				"device":    func(a *Allocation) { a.Containers[0].Devices[0].UUID = "GPU-2" },
				"share":     func(a *Allocation) { a.Containers[0].Devices[0].Exclusive = false },
				"unsigned":  func(a *Allocation) { a.Signature = "" },
				"garbage":   func(a *Allocation) { a.Signature = tt.alg + ":!!" },
				"no alg":    func(a *Allocation) { a.Signature = "abc" },
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

func TestKeyErrors(t *testing.T) {
	privPath, pubPath := ed25519Files(t)
	pub, err := LoadKey(pubPath)
	if err != nil {
		t.Fatal(err)
	}
	if pub.CanSign() {
		t.Error("a public key says it can sign")
	}
	if _, err := pub.Sign(signedAllocation()); err == nil {
		t.Error("a public key signed")
	}
	priv, err := LoadKey(privPath)
	if err != nil {
		t.Fatal(err)
	}
	// An HMAC-signed allocation is refused by an Ed25519 verifier, and back.
	hmacKey, err := ParseKey([]byte(strings.Repeat("k", MinHMACKeyBytes)))
	if err != nil {
		t.Fatal(err)
	}
	signed, _ := hmacKey.Sign(signedAllocation())
	if err := priv.Verify(signed); !errors.Is(err, ErrBadSignature) || !strings.Contains(err.Error(), `signed with "hmac-sha256", this node expects "ed25519"`) {
		t.Errorf("Ed25519 key verifying an HMAC signature: %v", err)
	}
	for _, tt := range []struct{ name, data, want string }{
		{"short secret", "too short", "9 bytes are too short"},
		{"other PEM", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", `PEM block "CERTIFICATE"`},
		{"bad PKCS8", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "parse PKCS #8 private key"},
		{"damaged PEM", "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEI", "looks like PEM but does not decode"},
		{"OpenSSH key", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl user@host", "OpenSSH key"},
	} {
		if _, err := ParseKey([]byte(tt.data)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: ParseKey() = %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
	if _, err := LoadKey(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("LoadKey of a missing file succeeded")
	}
}

func FuzzVerify(f *testing.F) {
	key, err := ParseKey([]byte(strings.Repeat("s", MinHMACKeyBytes)))
	if err != nil {
		f.Fatal(err)
	}
	signed, _ := key.Sign(signedAllocation())
	f.Add(signed.Signature)
	f.Add("ed25519:AAAA")
	f.Add("hmac-sha256:")
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
		if !errors.Is(err, ErrBadSignature) {
			t.Fatalf("Verify(%q) = %v, want ErrBadSignature", sig, err)
		}
	})
}

func FuzzParseKey(f *testing.F) {
	privPath, pubPath := ed25519Files(f)
	for _, p := range []string{privPath, pubPath} {
		b, _ := os.ReadFile(p)
		f.Add(b)
	}
	f.Add([]byte(strings.Repeat("x", 40)))
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := ParseKey(data)
		if err != nil {
			return
		}
		if k.CanSign() {
			signed, err := k.Sign(signedAllocation())
			if err != nil {
				t.Fatal(err)
			}
			if err := k.Verify(signed); err != nil {
				t.Fatalf("a key does not verify its own signature: %v", err)
			}
		}
	})
}
