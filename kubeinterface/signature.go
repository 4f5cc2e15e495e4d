package kubeinterface

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// ErrBadSignature is wrapped by Verify's error when an allocation's
// signature is missing, malformed, or was not made with the expected key: the
// allocation was not written by this cluster's scheduler.
var ErrBadSignature = errors.New("allocation signature is not valid")

// Signature algorithms, the prefix of a signature ("ed25519:BASE64").
const (
	// AlgEd25519 signs with an Ed25519 private key held by the scheduler
	// alone; nodes verify with the public key and cannot mint allocations.
	AlgEd25519 = "ed25519"
	// AlgHMACSHA256 signs with a secret shared by the scheduler and nodes.
	AlgHMACSHA256 = "hmac-sha256"
)

// MinHMACKeyBytes is the shortest shared secret accepted for HMAC-SHA256.
const MinHMACKeyBytes = 32

// maxKeyFileBytes bounds what LoadKey reads.
const maxKeyFileBytes = 64 << 10

// Key signs allocations, verifies them, or both. Build it with LoadKey or
// ParseKey. A Key is immutable and safe for concurrent use.
type Key struct {
	alg     string
	secret  []byte             // AlgHMACSHA256
	private ed25519.PrivateKey // AlgEd25519, nil on verify-only keys
	public  ed25519.PublicKey  // AlgEd25519
}

// LoadKey reads a key file; see ParseKey for the formats.
func LoadKey(path string) (*Key, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read allocation key: %w", err)
	}
	defer f.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(f, maxKeyFileBytes+1)); err != nil {
		return nil, fmt.Errorf("read allocation key %s: %w", path, err)
	}
	if buf.Len() > maxKeyFileBytes {
		return nil, fmt.Errorf("allocation key %s: larger than %d bytes, not a key file", path, maxKeyFileBytes)
	}
	k, err := ParseKey(buf.Bytes())
	if err != nil {
		return nil, fmt.Errorf("allocation key %s: %w", path, err)
	}
	return k, nil
}

// ParseKey parses a key in one of these forms:
//
//   - a PEM "PRIVATE KEY" block holding a PKCS #8 Ed25519 key (as made by
//     `openssl genpkey -algorithm ed25519`): signs and verifies. This is
//     the scheduler's key.
//   - a PEM "PUBLIC KEY" block holding a PKIX Ed25519 key (`openssl pkey
//     -pubout`): verifies only. This is what nodes should hold.
//   - anything else is an HMAC-SHA256 secret shared by the scheduler and the
//     nodes: the bytes with surrounding white space removed, at least
//     MinHMACKeyBytes long (e.g. `head -c 32 /dev/urandom | base64`).
func ParseKey(data []byte) (*Key, error) {
	if block, _ := pem.Decode(data); block != nil {
		switch block.Type {
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parse PKCS #8 private key: %w", err)
			}
			priv, ok := k.(ed25519.PrivateKey)
			if !ok {
				return nil, fmt.Errorf("private key is a %T, want an Ed25519 key", k)
			}
			return &Key{alg: AlgEd25519, private: priv, public: priv.Public().(ed25519.PublicKey)}, nil
		case "PUBLIC KEY":
			k, err := x509.ParsePKIXPublicKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parse PKIX public key: %w", err)
			}
			pub, ok := k.(ed25519.PublicKey)
			if !ok {
				return nil, fmt.Errorf("public key is a %T, want an Ed25519 key", k)
			}
			return &Key{alg: AlgEd25519, public: pub}, nil
		default:
			return nil, fmt.Errorf("PEM block %q: want \"PRIVATE KEY\" (Ed25519, PKCS #8) or \"PUBLIC KEY\" (Ed25519, PKIX)", block.Type)
		}
	}
	if bytes.Contains(data, []byte("-----BEGIN")) {
		return nil, errors.New("the file looks like PEM but does not decode: a damaged key? (an HMAC secret must not contain -----BEGIN)")
	}
	if bytes.HasPrefix(bytes.TrimSpace(data), []byte("ssh-")) {
		return nil, errors.New("the file is an OpenSSH key; convert it to PEM (ssh-keygen -e -m PKCS8) or use openssl genpkey -algorithm ed25519")
	}
	secret := bytes.TrimSpace(data)
	if len(secret) < MinHMACKeyBytes {
		return nil, fmt.Errorf("not a PEM Ed25519 key, and as an HMAC secret %d bytes are too short (want at least %d)", len(secret), MinHMACKeyBytes)
	}
	return &Key{alg: AlgHMACSHA256, secret: bytes.Clone(secret)}, nil
}

// NewEd25519Key returns a Key that signs with priv.
func NewEd25519Key(priv ed25519.PrivateKey) *Key {
	return &Key{alg: AlgEd25519, private: priv, public: priv.Public().(ed25519.PublicKey)}
}

// Algorithm is AlgEd25519 or AlgHMACSHA256.
func (k *Key) Algorithm() string { return k.alg }

// CanSign reports whether the key can sign (not a verify-only public key).
func (k *Key) CanSign() bool { return k.alg == AlgHMACSHA256 || k.private != nil }

// Sign returns a with its Signature set.
func (k *Key) Sign(a Allocation) (Allocation, error) {
	msg := a.SigningBytes()
	switch {
	case k.alg == AlgHMACSHA256:
		a.Signature = AlgHMACSHA256 + ":" + base64.StdEncoding.EncodeToString(k.mac(msg))
	case k.private != nil:
		a.Signature = AlgEd25519 + ":" + base64.StdEncoding.EncodeToString(ed25519.Sign(k.private, msg))
	default:
		return a, errors.New("sign allocation: the key is an Ed25519 public key, which can only verify")
	}
	return a, nil
}

// Verify checks a's signature. The error wraps ErrBadSignature and says
// what is wrong with it; it never reveals the expected signature.
func (k *Key) Verify(a Allocation) error {
	if a.Signature == "" {
		return fmt.Errorf("%w: the allocation is not signed", ErrBadSignature)
	}
	alg, encoded, ok := strings.Cut(a.Signature, ":")
	if !ok {
		return fmt.Errorf("%w: want ALGORITHM:BASE64", ErrBadSignature)
	}
	if alg != k.alg {
		return fmt.Errorf("%w: signed with %q, this node expects %q", ErrBadSignature, abbreviate(alg), k.alg)
	}
	sig, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		return fmt.Errorf("%w: signature is not base64", ErrBadSignature)
	}
	msg := a.SigningBytes()
	switch k.alg {
	case AlgHMACSHA256:
		if !hmac.Equal(sig, k.mac(msg)) {
			return fmt.Errorf("%w: does not match the cluster's key", ErrBadSignature)
		}
	case AlgEd25519:
		if len(sig) != ed25519.SignatureSize || !ed25519.Verify(k.public, msg, sig) {
			return fmt.Errorf("%w: does not match the cluster's key", ErrBadSignature)
		}
	}
	return nil
}

func (k *Key) mac(msg []byte) []byte {
	h := hmac.New(sha256.New, k.secret)
	h.Write(msg)
	return h.Sum(nil)
}
