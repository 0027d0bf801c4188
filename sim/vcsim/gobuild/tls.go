package main

// TLS for the SDK endpoint. Clients must be able to verify the server the way they would a
// real vCenter: by default a throw-away CA is generated at start and signs a server
// certificate for 127.0.0.1, ::1 and localhost; the CA's PEM is written where -ca-file says.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
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

// serverTLS returns the TLS configuration of the SDK endpoint and writes the PEM that clients
// should trust to caFile. With certFile/keyFile given, that pair is served and its
// certificate chain is what caFile receives.
func serverTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	var (
		cert  tls.Certificate
		trust []byte
		err   error
	)
	if certFile != "" {
		cert, err = tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("load -tlscert/-tlskey: %w", err)
		}
		trust, err = os.ReadFile(certFile)
		if err != nil {
			return nil, err
		}
	} else {
		cert, trust, err = generateCertificates()
		if err != nil {
			return nil, fmt.Errorf("generate certificates: %w", err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(caFile), 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(caFile, trust, 0o600); err != nil {
		return nil, fmt.Errorf("write CA file: %w", err)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
	}, nil
}

// generateCertificates makes a CA and a server certificate it signs. It returns the server
// key pair (with the CA in its chain) and the CA certificate as PEM.
func generateCertificates() (tls.Certificate, []byte, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	caTemplate := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "agent-forge vcsim CA", Organization: []string{"agent-forge test"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return tls.Certificate{}, nil, err
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	template := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "127.0.0.1", Organization: []string{"agent-forge test"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	cert := tls.Certificate{
		Certificate: [][]byte{der, caDER},
		PrivateKey:  key,
		Leaf:        leaf,
	}
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return n
}
