package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/kubegpu/kubegpu/internal/keyfiles"
	"github.com/kubegpu/kubegpu/kubeinterface"
)

// keyring holds the generations of the allocation signing key: the
// scheduler signs with the newest, nodes trust a file of one or two
// public keys, and the checker verifies with every public key ever made.
type keyring struct {
	dir string

	mu   sync.Mutex
	gens []keyGen
	// trustedFile is the file of public keys the nodes trust now.
	trustedFile string
	all         *kubeinterface.KeySet
}

type keyGen struct {
	private, public string
	id              string
}

func newKeyring(dir string) (*keyring, error) {
	k := &keyring{dir: dir, all: kubeinterface.NewKeySet()}
	if _, err := k.add(); err != nil {
		return nil, err
	}
	path, err := k.trust(0)
	if err != nil {
		return nil, err
	}
	k.trustedFile = path
	return k, nil
}

// add makes a new key generation and returns its number.
func (k *keyring) add() (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := len(k.gens)
	dir := filepath.Join(k.dir, strconv.Itoa(n))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	priv, pub, err := keyfiles.WriteEd25519(dir)
	if err != nil {
		return 0, err
	}
	keys, err := kubeinterface.LoadVerifyKeys(pub)
	if err != nil {
		return 0, err
	}
	k.gens = append(k.gens, keyGen{private: priv, public: pub, id: keys.Keys()[0].ID()})
	k.all = kubeinterface.NewKeySet(append(k.all.Keys(), keys.Keys()...)...)
	return n, nil
}

// trust writes a file of the public keys of the given generations, for
// nodes, and returns its path.
func (k *keyring) trust(gens ...int) (string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var pem []byte
	name := "trusted"
	for _, g := range gens {
		b, err := os.ReadFile(k.gens[g].public)
		if err != nil {
			return "", err
		}
		pem = append(pem, b...)
		name += "-" + strconv.Itoa(g)
	}
	path := filepath.Join(k.dir, name+".pub.pem")
	if err := os.WriteFile(path, pem, 0o644); err != nil {
		return "", err
	}
	return path, nil
}

// trusted is the path of the file of public keys the nodes trust now.
func (k *keyring) trusted() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.trustedFile
}

func (k *keyring) setTrusted(path string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.trustedFile = path
}

// gen returns a generation.
func (k *keyring) gen(n int) keyGen {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.gens[n]
}

// newest is the newest generation's number.
func (k *keyring) newest() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.gens) - 1
}

// verifier verifies with every public key ever made.
func (k *keyring) verifier() *kubeinterface.KeySet {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.all
}

// skewClock is a node's clock, off by a settable amount: a simulated
// kubelet's renewals carry its time.
type skewClock struct {
	clock.RealClock
	mu     sync.Mutex
	offset time.Duration
}

func (c *skewClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *skewClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func (c *skewClock) set(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset = d
}

func (c *skewClock) String() string { return fmt.Sprintf("clock off by %s", c.offset) }
