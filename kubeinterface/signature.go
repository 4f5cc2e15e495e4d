package kubeinterface

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"filippo.io/edwards25519"
)

// ErrBadSignature is wrapped by Verify's error when an allocation's
// signature is missing, malformed, or was not made with the expected key: the
// allocation was not written by this cluster's scheduler.
var ErrBadSignature = errors.New("allocation signature is not valid")

// Signature algorithms, the first field of a signature
// ("ed25519:KEYID:BASE64").
const (
	// AlgEd25519 signs with an Ed25519 private key held by the scheduler
	// alone; nodes verify with the public key and cannot mint allocations.
	AlgEd25519 = "ed25519"
	// AlgHMACSHA256 signs with a secret shared by the scheduler and nodes:
	// any holder of the secret can mint allocations for any pod on any
	// node. Use it only where every node is as trusted as the scheduler.
	AlgHMACSHA256 = "hmac-sha256"
)

// PEM block types of key files.
const (
	PEMPrivateKey = "PRIVATE KEY" // Ed25519, PKCS #8
	PEMPublicKey  = "PUBLIC KEY"  // Ed25519, PKIX
	// PEMHMACSecret holds an HMAC-SHA256 secret, the block's bytes.
	PEMHMACSecret = "KUBEGPU HMAC-SHA256 SECRET"
)

// MinHMACKeyBytes is the shortest shared secret accepted for HMAC-SHA256.
const MinHMACKeyBytes = 32

// MaxKeysPerFile bounds the keys one key file holds.
const MaxKeysPerFile = 16

// keyIDHexChars is the length of a key ID.
const keyIDHexChars = 16

// maxKeyFileBytes bounds what a key file may hold.
const maxKeyFileBytes = 64 << 10

// Key signs allocations, verifies them, or both. Build it with
// LoadSigningKey, ParseKeys or NewEd25519Key. A Key is immutable and safe
// for concurrent use.
type Key struct {
	alg     string
	id      string
	secret  []byte             // AlgHMACSHA256
	private ed25519.PrivateKey // AlgEd25519, nil on verify-only keys
	public  ed25519.PublicKey  // AlgEd25519
}

// readKeyFile reads a key file, bounded.
func readKeyFile(path string) ([]byte, error) {
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
	return buf.Bytes(), nil
}

// LoadSigningKey reads the scheduler's key file: one key that can sign, an
// Ed25519 private key or an HMAC secret.
func LoadSigningKey(path string) (*Key, error) {
	data, err := readKeyFile(path)
	if err != nil {
		return nil, err
	}
	keys, err := ParseKeys(data)
	if err != nil {
		return nil, fmt.Errorf("allocation signing key %s: %w", path, err)
	}
	switch {
	case len(keys) != 1:
		return nil, fmt.Errorf("allocation signing key %s: %d keys; the scheduler signs with exactly one (give the others as verification keys)", path, len(keys))
	case !keys[0].CanSign():
		return nil, fmt.Errorf("allocation signing key %s: an Ed25519 public key cannot sign: the scheduler needs the private key", path)
	}
	return keys[0], nil
}

// LoadVerifyKeys reads a file of keys that verify allocations: one or more
// Ed25519 public keys (or HMAC secrets), all of which are accepted, so that
// the signing key can be rotated. A private key is refused: whoever holds
// it can sign, and a verifier needs only the public half.
func LoadVerifyKeys(path string) (*KeySet, error) {
	data, err := readKeyFile(path)
	if err != nil {
		return nil, err
	}
	keys, err := ParseKeys(data)
	if err != nil {
		return nil, fmt.Errorf("allocation key %s: %w", path, err)
	}
	for _, k := range keys {
		if k.private != nil {
			return nil, fmt.Errorf("allocation key %s: holds a private key (ID %s), which can sign allocations; give this host only the public key (openssl pkey -in KEY -pubout -out KEY.pub.pem)", path, k.id)
		}
	}
	return NewKeySet(keys...), nil
}

// ParseKeys parses a key file: one or more PEM blocks, each
//
//   - "PRIVATE KEY", a PKCS #8 Ed25519 key (`openssl genpkey -algorithm
//     ed25519`): signs and verifies. The scheduler's key.
//   - "PUBLIC KEY", a PKIX Ed25519 key (`openssl pkey -pubout`): verifies
//     only. What nodes hold.
//   - "KUBEGPU HMAC-SHA256 SECRET", an HMAC-SHA256 secret of at least
//     MinHMACKeyBytes bytes shared by the scheduler and the nodes. Any
//     holder can mint allocations: not recommended.
//
// Text outside the blocks is ignored; anything that is not such a block
// (a bare secret, a certificate, an OpenSSH key, a kubeconfig) is an error.
func ParseKeys(data []byte) ([]*Key, error) {
	var keys []*Key
	rest := data
	for {
		block, next := pem.Decode(rest)
		if block == nil {
			break
		}
		rest = next
		if len(keys) == MaxKeysPerFile {
			return nil, fmt.Errorf("more than %d keys", MaxKeysPerFile)
		}
		k, err := parseBlock(block)
		if err != nil {
			return nil, fmt.Errorf("key %d: %w", len(keys)+1, err)
		}
		keys = append(keys, k)
	}
	if begins := bytes.Count(data, []byte("-----BEGIN ")); begins != len(keys) {
		return nil, fmt.Errorf("the file has %d PEM blocks but %d decode: a damaged key?", begins, len(keys))
	}
	if len(keys) > 0 {
		return keys, nil
	}
	trimmed := bytes.TrimSpace(data)
	switch {
	case len(trimmed) == 0:
		return nil, errors.New("the file is empty")
	case bytes.HasPrefix(trimmed, []byte("ssh-")):
		return nil, errors.New("the file is an OpenSSH key; convert it to PEM (ssh-keygen -e -m PKCS8) or use openssl genpkey -algorithm ed25519")
	default:
		return nil, fmt.Errorf("not a PEM key file: want %q (Ed25519), %q (Ed25519) or %q blocks; a bare HMAC secret is no longer accepted, wrap it in a %q block (see kubeinterface/README.md)",
			PEMPrivateKey, PEMPublicKey, PEMHMACSecret, PEMHMACSecret)
	}
}

func parseBlock(block *pem.Block) (*Key, error) {
	switch block.Type {
	case PEMPrivateKey:
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse PKCS #8 private key: %w", err)
		}
		priv, ok := k.(ed25519.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("private key is a %T, want an Ed25519 key", k)
		}
		return NewEd25519Key(priv), nil
	case PEMPublicKey:
		k, err := x509.ParsePKIXPublicKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse PKIX public key: %w", err)
		}
		pub, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("public key is a %T, want an Ed25519 key", k)
		}
		if err := checkEd25519Public(pub); err != nil {
			return nil, err
		}
		return &Key{alg: AlgEd25519, id: ed25519ID(pub), public: pub}, nil
	case PEMHMACSecret:
		return NewHMACKey(block.Bytes)
	default:
		return nil, fmt.Errorf("PEM block %q: want %q (Ed25519, PKCS #8), %q (Ed25519, PKIX) or %q", block.Type, PEMPrivateKey, PEMPublicKey, PEMHMACSecret)
	}
}

// ErrWeakKey is wrapped when an Ed25519 public key is of small order (8·A
// is the identity), such as the all-zero or identity "placeholder" keys:
// signatures made without the private key verify with it.
var ErrWeakKey = errors.New("the Ed25519 public key is of small order, so forged signatures verify with it: it is a placeholder or a damaged key, not one made by openssl genpkey -algorithm ed25519")

// checkEd25519Public refuses a public key that is not a point of the curve
// or is of small order.
func checkEd25519Public(pub ed25519.PublicKey) error {
	p, err := new(edwards25519.Point).SetBytes(pub)
	if err != nil {
		return fmt.Errorf("the Ed25519 public key is not a point of the curve: %w", err)
	}
	if new(edwards25519.Point).MultByCofactor(p).Equal(edwards25519.NewIdentityPoint()) == 1 {
		return ErrWeakKey
	}
	return nil
}

// NewEd25519Key returns a Key that signs with priv.
func NewEd25519Key(priv ed25519.PrivateKey) *Key {
	pub := priv.Public().(ed25519.PublicKey)
	return &Key{alg: AlgEd25519, id: ed25519ID(pub), private: priv, public: pub}
}

// NewHMACKey returns a Key that signs and verifies with an HMAC-SHA256
// secret of at least MinHMACKeyBytes bytes.
func NewHMACKey(secret []byte) (*Key, error) {
	if len(secret) < MinHMACKeyBytes {
		return nil, fmt.Errorf("HMAC secret of %d bytes is too short (want at least %d)", len(secret), MinHMACKeyBytes)
	}
	sum := sha256.Sum256(append([]byte("kubegpu hmac-sha256 key id\x00"), secret...))
	return &Key{alg: AlgHMACSHA256, id: hex.EncodeToString(sum[:])[:keyIDHexChars], secret: bytes.Clone(secret)}, nil
}

// EncodeHMACSecret returns the PEM key file for an HMAC secret.
func EncodeHMACSecret(secret []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: PEMHMACSecret, Bytes: secret})
}

// ed25519ID is a public key's ID: the first hex digits of the SHA-256 of
// its PKIX encoding (`openssl pkey -pubin -outform DER | sha256sum`).
func ed25519ID(pub ed25519.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		panic(fmt.Sprintf("marshal an Ed25519 public key: %v", err))
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])[:keyIDHexChars]
}

// Algorithm is AlgEd25519 or AlgHMACSHA256.
func (k *Key) Algorithm() string { return k.alg }

// ID is the key's ID, which signatures name.
func (k *Key) ID() string { return k.id }

// CanSign reports whether the key can sign (not a verify-only public key).
func (k *Key) CanSign() bool { return k.alg == AlgHMACSHA256 || k.private != nil }

// Public returns the key without its private half: what verifies.
func (k *Key) Public() *Key {
	if k.private == nil {
		return k
	}
	return &Key{alg: k.alg, id: k.id, public: k.public}
}

// Sign returns a with its Signature set: "ALGORITHM:KEYID:BASE64", over
// a's encoding (bytes a was read from, if any, are not signed again), and
// Critical listing what its content needs a reader to understand.
func (k *Key) Sign(a Allocation) (Allocation, error) {
	a = a.withCritical()
	a.signed = nil
	msg := a.SigningBytes()
	var sig []byte
	switch {
	case k.alg == AlgHMACSHA256:
		sig = k.mac(msg)
	case k.private != nil:
		sig = ed25519.Sign(k.private, msg)
	default:
		return a, errors.New("sign allocation: the key is an Ed25519 public key, which can only verify")
	}
	a.Signature = k.alg + ":" + k.id + ":" + base64.StdEncoding.EncodeToString(sig)
	return a, nil
}

// SignWithoutKeyID signs as versions before key IDs did
// ("ALGORITHM:BASE64"), which they alone can verify; current verifiers
// accept it too. Only for upgrading clusters whose nodes run such versions.
func (k *Key) SignWithoutKeyID(a Allocation) (Allocation, error) {
	signed, err := k.Sign(a)
	if err != nil {
		return a, err
	}
	parts := strings.SplitN(signed.Signature, ":", 3)
	signed.Signature = parts[0] + ":" + parts[2]
	return signed, nil
}

// Verify checks a's signature against this key alone.
func (k *Key) Verify(a Allocation) error { return NewKeySet(k).Verify(a) }

func (k *Key) mac(msg []byte) []byte {
	h := hmac.New(sha256.New, k.secret)
	h.Write(msg)
	return h.Sum(nil)
}

func (k *Key) check(msg, sig []byte) bool {
	switch k.alg {
	case AlgHMACSHA256:
		return hmac.Equal(sig, k.mac(msg))
	case AlgEd25519:
		return len(sig) == ed25519.SignatureSize && ed25519.Verify(k.public, msg, sig)
	}
	return false
}

// KeySet verifies allocations signed with any of its keys: during a key
// rotation, the old key and the new one. It is immutable and safe for
// concurrent use.
type KeySet struct {
	keys []*Key // verify-only, unique IDs
}

// NewKeySet returns the set of keys' public halves (duplicates once).
func NewKeySet(keys ...*Key) *KeySet {
	s := &KeySet{}
	for _, k := range keys {
		if k == nil || s.byID(k.id) != nil {
			continue
		}
		s.keys = append(s.keys, k.Public())
	}
	return s
}

// Len is the number of keys.
func (s *KeySet) Len() int { return len(s.keys) }

// Keys returns the set's keys.
func (s *KeySet) Keys() []*Key { return slices.Clone(s.keys) }

// IDs are the keys' IDs, as "ALGORITHM:KEYID".
func (s *KeySet) IDs() []string {
	out := make([]string, len(s.keys))
	for i, k := range s.keys {
		out[i] = k.alg + ":" + k.id
	}
	return out
}

// HasHMAC reports whether a key of the set is a shared HMAC secret.
func (s *KeySet) HasHMAC() bool {
	return slices.ContainsFunc(s.keys, func(k *Key) bool { return k.alg == AlgHMACSHA256 })
}

func (s *KeySet) byID(id string) *Key {
	for _, k := range s.keys {
		if k.id == id {
			return k
		}
	}
	return nil
}

// SignatureKeyID returns the key ID a signature names ("" for a signature
// made before key IDs, or a malformed one).
func SignatureKeyID(signature string) string {
	parts := strings.Split(signature, ":")
	if len(parts) != 3 {
		return ""
	}
	return parts[1]
}

// Verify checks a's signature: made by the key of the set it names. A
// signature written before key IDs ("ALGORITHM:BASE64") is checked against
// every key of its algorithm. The error wraps ErrBadSignature and says
// what is wrong; it never reveals an expected signature.
func (s *KeySet) Verify(a Allocation) error {
	if a.Signature == "" {
		return fmt.Errorf("%w: the allocation is not signed", ErrBadSignature)
	}
	parts := strings.Split(a.Signature, ":")
	var alg, id, encoded string
	switch len(parts) {
	case 3:
		alg, id, encoded = parts[0], parts[1], parts[2]
	case 2:
		alg, encoded = parts[0], parts[1]
	default:
		return fmt.Errorf("%w: want ALGORITHM:KEYID:BASE64", ErrBadSignature)
	}
	sig, err := base64.StdEncoding.Strict().DecodeString(encoded)
	if err != nil {
		return fmt.Errorf("%w: signature is not base64", ErrBadSignature)
	}
	msg := a.SigningBytes()
	if id != "" {
		k := s.byID(id)
		switch {
		case k == nil:
			return fmt.Errorf("%w: signed with key %s, which is not among the keys held here (%s)", ErrBadSignature, abbreviate(id), strings.Join(s.IDs(), ", "))
		case k.alg != alg:
			return fmt.Errorf("%w: signed with %q, key %s is %q", ErrBadSignature, abbreviate(alg), k.id, k.alg)
		case !k.check(msg, sig):
			return fmt.Errorf("%w: does not match key %s", ErrBadSignature, k.id)
		}
		return nil
	}
	tried := 0
	for _, k := range s.keys {
		if k.alg != alg {
			continue
		}
		tried++
		if k.check(msg, sig) {
			return nil
		}
	}
	if tried == 0 {
		return fmt.Errorf("%w: signed with %q, the keys held here are %s", ErrBadSignature, abbreviate(alg), strings.Join(s.IDs(), ", "))
	}
	return fmt.Errorf("%w: does not match the keys held here", ErrBadSignature)
}
