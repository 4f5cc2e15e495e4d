package localcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// pki is the cluster's certificate authority and the files made from it.
type pki struct {
	ca     *x509.Certificate
	caPriv *ecdsa.PrivateKey
	serial atomic.Int64
	now    time.Time

	caCert, caKey               []byte // PEM
	serverCert, serverKey       []byte
	adminCert, adminKey         []byte
	serviceAccountKey           []byte // RSA private key, PEM
	caFile, caKeyFile           string
	serverCertFile              string
	serverKeyFile, saKeyFile    string
	adminCertFile, adminKeyFile string
	// kubeletClientCertFile and kubeletClientKeyFile are the API server's
	// identity towards kubelets (logs, exec).
	kubeletClientCertFile, kubeletClientKeyFile string
}

// newPKI makes a CA, a serving certificate for the loopback API server, an
// admin client certificate (group system:masters, for installing only) and
// the API server's kubelet client certificate, and writes them to dir.
func newPKI(dir string) (*pki, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubegpu-local-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("create CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	p := &pki{ca: ca, caPriv: caKey, now: now, caCert: pemBlock("CERTIFICATE", caDER)}
	p.serial.Store(1)
	keyDER, err := x509.MarshalECPrivateKey(caKey)
	if err != nil {
		return nil, err
	}
	p.caKey = pemBlock("EC PRIVATE KEY", keyDER)
	p.serverCert, p.serverKey, err = p.leaf(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 0, 0, 1)},
	})
	if err != nil {
		return nil, fmt.Errorf("create serving certificate: %w", err)
	}
	if p.adminCert, p.adminKey, err = p.client("kubegpu-admin", "system:masters"); err != nil {
		return nil, fmt.Errorf("create admin certificate: %w", err)
	}
	kubeletCert, kubeletKey, err := p.client("kube-apiserver-kubelet-client", "system:masters")
	if err != nil {
		return nil, fmt.Errorf("create kubelet client certificate: %w", err)
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	p.serviceAccountKey = pemBlock("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey))

	files := []struct {
		name string
		data []byte
		path *string
	}{
		{"ca.crt", p.caCert, &p.caFile},
		{"ca.key", p.caKey, &p.caKeyFile},
		{"apiserver.crt", p.serverCert, &p.serverCertFile},
		{"apiserver.key", p.serverKey, &p.serverKeyFile},
		{"service-account.key", p.serviceAccountKey, &p.saKeyFile},
		{"admin.crt", p.adminCert, &p.adminCertFile},
		{"admin.key", p.adminKey, &p.adminKeyFile},
		{"apiserver-kubelet-client.crt", kubeletCert, &p.kubeletClientCertFile},
		{"apiserver-kubelet-client.key", kubeletKey, &p.kubeletClientKeyFile},
	}
	for _, f := range files {
		*f.path = filepath.Join(dir, f.name)
		if err := os.WriteFile(*f.path, f.data, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// client issues a client certificate for user cn in groups orgs, as
// kubeadm and kubelet's bootstrap do: the API server takes the common name
// as the user name and the organizations as its groups.
func (p *pki) client(cn string, orgs ...string) (certPEM, keyPEM []byte, err error) {
	return p.leaf(&x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: orgs},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// leaf signs tmpl, a template without key, serial or validity, with the CA.
func (p *pki) leaf(tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = big.NewInt(p.serial.Add(1))
	tmpl.NotBefore, tmpl.NotAfter = p.now.Add(-time.Hour), p.now.Add(7*24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caPriv)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", keyDER), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
