// Package keyfiles writes allocation key files for the demo, the tests and
// the benchmarks, as an operator makes them with openssl.
package keyfiles

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
)

// Names of the files WriteEd25519 writes.
const (
	Private = "allocation-key.pem"
	Public  = "allocation-key.pub.pem"
)

// WriteEd25519 makes an Ed25519 key, as `openssl genpkey -algorithm
// ed25519` does, and writes it into dir: the private key as PKCS #8 PEM
// (mode 0600, the scheduler's) and its public key as PKIX PEM (0644, the
// nodes'). It returns the two paths.
func WriteEd25519(dir string) (private, public string, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("generate a key: %w", err)
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return "", "", fmt.Errorf("encode the private key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", "", fmt.Errorf("encode the public key: %w", err)
	}
	private, public = filepath.Join(dir, Private), filepath.Join(dir, Public)
	if err := os.WriteFile(private, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER}), 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(public, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		return "", "", err
	}
	return private, public, nil
}
