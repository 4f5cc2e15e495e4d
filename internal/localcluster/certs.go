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
	"time"
)

// pki is the cluster's certificate authority and the files made from it.
type pki struct {
	caCert, caKey               []byte // PEM
	serverCert, serverKey       []byte
	adminCert, adminKey         []byte
	serviceAccountKey           []byte // RSA private key, PEM
	caFile, serverCertFile      string
	serverKeyFile, saKeyFile    string
	adminCertFile, adminKeyFile string
}

// newPKI makes a CA, a serving certificate for the loopback API server and
// an admin client certificate (group system:masters), and writes them to dir.
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
	ca, _ := x509.ParseCertificate(caDER)
	leaf := func(serial int64, tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(7*24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, nil, err
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return nil, nil, err
		}
		return pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", keyDER), nil
	}
	p := &pki{caCert: pemBlock("CERTIFICATE", caDER)}
	if keyDER, err := x509.MarshalECPrivateKey(caKey); err == nil {
		p.caKey = pemBlock("EC PRIVATE KEY", keyDER)
	}
	p.serverCert, p.serverKey, err = leaf(2, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 0, 0, 1)},
	})
	if err != nil {
		return nil, fmt.Errorf("create serving certificate: %w", err)
	}
	p.adminCert, p.adminKey, err = leaf(3, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kubegpu-admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, fmt.Errorf("create admin certificate: %w", err)
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
		{"apiserver.crt", p.serverCert, &p.serverCertFile},
		{"apiserver.key", p.serverKey, &p.serverKeyFile},
		{"service-account.key", p.serviceAccountKey, &p.saKeyFile},
		{"admin.crt", p.adminCert, &p.adminCertFile},
		{"admin.key", p.adminKey, &p.adminKeyFile},
	}
	for _, f := range files {
		*f.path = filepath.Join(dir, f.name)
		if err := os.WriteFile(*f.path, f.data, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
