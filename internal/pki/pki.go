// Package pki makes and reads the certificates and tokens that keep the
// fabric out of the control plane: a CA, server certificates for the
// controller (etcd's client port and the REST API), client certificates for
// agents and operators, and the API's bearer token. It uses the standard
// library only (crypto/x509, crypto/tls) and touches no network.
//
// Keys and tokens are written with mode 0600 and refused when group or
// others can read them; certificates are public and written 0644.
package pki

import (
	"cmp"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"time"
)

// DefaultValidity is how long certificates made by this package last. A lab
// lives for hours; an operator who uses these for production rotates them.
const DefaultValidity = 365 * 24 * time.Hour

// CA is a certificate authority: the one root every component trusts.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA makes a self-signed CA named commonName, valid from now for validity.
func NewCA(commonName string, now time.Time, validity time.Duration) (*CA, error) {
	if commonName == "" {
		return nil, errors.New("ca: empty common name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ca %s: generate key: %w", commonName, err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"onehop"}},
		NotBefore:             now.Add(-Backdate),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true, // it signs leaves only
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("ca %s: sign: %w", commonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("ca %s: %w", commonName, err)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Kind says what a certificate is for.
type Kind int

const (
	// Client certificates authenticate an agent or an operator to etcd and
	// the REST API.
	Client Kind = iota
	// Server certificates identify the controller to agents and API
	// clients. They also carry client usage: the controller dials its own
	// etcd (or an external cluster) with the same certificate.
	Server
)

// Request describes a certificate to issue.
type Request struct {
	Kind       Kind
	CommonName string       // a node name for agents (h1), "controller" for the controller
	IPs        []netip.Addr // subject alternative names a client may dial (servers)
	DNSNames   []string     // same, by name
	Validity   time.Duration
	// Organization is the subject's O: "onehop" when empty;
	// TenantOrganization for a tenant's certificate (TenantRequest).
	Organization string
}

// Pair is an issued certificate and its private key.
type Pair struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// Issue signs a certificate for req, valid from now.
func (ca *CA) Issue(req Request, now time.Time) (*Pair, error) {
	if req.CommonName == "" {
		return nil, errors.New("certificate request: empty common name")
	}
	if req.Kind == Server && len(req.IPs) == 0 && len(req.DNSNames) == 0 {
		return nil, fmt.Errorf("server certificate %s: no IP or DNS name to serve on", req.CommonName)
	}
	if req.Validity <= 0 {
		req.Validity = DefaultValidity
	}
	notAfter := now.Add(req.Validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter // a leaf cannot outlive its CA
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certificate %s: generate key: %w", req.CommonName, err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: req.CommonName, Organization: []string{cmp.Or(req.Organization, "onehop")}},
		NotBefore:    now.Add(-Backdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		DNSNames:     req.DNSNames,
	}
	if req.Kind == Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	for _, ip := range req.IPs {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip.AsSlice())
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("certificate %s: sign: %w", req.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certificate %s: %w", req.CommonName, err)
	}
	return &Pair{Cert: cert, Key: key}, nil
}

// Verify checks that cert was signed by this CA for usage at now.
func (ca *CA) Verify(cert *x509.Certificate, usage x509.ExtKeyUsage, now time.Time) error {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	_, err := cert.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certificate serial: %w", err)
	}
	return s, nil
}

// CertPEM encodes a certificate as PEM.
func CertPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// KeyPEM encodes a private key as PKCS #8 PEM.
func KeyPEM(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("encode private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseCertPEM reads the first certificate in b.
func ParseCertPEM(b []byte) (*x509.Certificate, error) {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil, errors.New("no PEM CERTIFICATE block")
		}
		if blk.Type == "CERTIFICATE" {
			return x509.ParseCertificate(blk.Bytes)
		}
	}
}

// ParseKeyPEM reads the first private key in b (PKCS #8, EC or PKCS #1).
func ParseKeyPEM(b []byte) (crypto.Signer, error) {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil, errors.New("no PEM private key block")
		}
		var k any
		var err error
		switch blk.Type {
		case "PRIVATE KEY":
			k, err = x509.ParsePKCS8PrivateKey(blk.Bytes)
		case "EC PRIVATE KEY":
			k, err = x509.ParseECPrivateKey(blk.Bytes)
		case "RSA PRIVATE KEY":
			k, err = x509.ParsePKCS1PrivateKey(blk.Bytes)
		default:
			continue
		}
		if err != nil {
			return nil, err
		}
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("%T is not a signing key", k)
		}
		return s, nil
	}
}
