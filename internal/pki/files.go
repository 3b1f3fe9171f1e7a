package pki

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
)

// WriteCert writes a certificate as PEM to path (mode 0644: it is public).
func WriteCert(path string, c *x509.Certificate) error {
	return writeFile(path, CertPEM(c), 0o644)
}

// WriteKey writes a private key as PEM to path with mode 0600.
func WriteKey(path string, k crypto.Signer) error {
	b, err := KeyPEM(k)
	if err != nil {
		return err
	}
	return writeFile(path, b, 0o600)
}

// Write writes the pair's certificate and key (0600) to certPath and keyPath.
func (p *Pair) Write(certPath, keyPath string) error {
	if err := WriteKey(keyPath, p.Key); err != nil {
		return err
	}
	return WriteCert(certPath, p.Cert)
}

// Write writes the CA's certificate and key (0600) to certPath and keyPath.
func (ca *CA) Write(certPath, keyPath string) error {
	return (&Pair{Cert: ca.Cert, Key: ca.Key}).Write(certPath, keyPath)
}

// writeFile writes b to path atomically: a reader never sees half a key,
// and the key is never, even briefly, in a file with a wider mode.
func writeFile(path string, b []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing left to remove
	// CreateTemp makes the file 0600; widen it only for certificates.
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// ReadSecret reads a key or token file, refusing one that group or others
// can read or write: a secret anyone on the machine can read is no secret.
func ReadSecret(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	if m := fi.Mode().Perm(); m&0o077 != 0 {
		return nil, fmt.Errorf("%s: mode %#o lets group or others read it; chmod 600 %s", path, m, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// ReadCert reads the first certificate of a PEM file.
func ReadCert(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := ParseCertPEM(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// LoadCA reads a CA's certificate and key, e.g. to issue more certificates.
func LoadCA(certPath, keyPath string) (*CA, error) {
	c, err := ReadCert(certPath)
	if err != nil {
		return nil, err
	}
	if !c.IsCA {
		return nil, fmt.Errorf("%s: not a CA certificate", certPath)
	}
	kb, err := ReadSecret(keyPath)
	if err != nil {
		return nil, err
	}
	k, err := ParseKeyPEM(kb)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyPath, err)
	}
	return &CA{Cert: c, Key: k}, nil
}

// ReadPool reads every certificate of a PEM file into a pool of roots.
func ReadPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate in it", path)
	}
	return pool, nil
}

// Files names the PEM files one component uses: the CA it trusts, and its
// own certificate and key.
type Files struct {
	CA   string
	Cert string
	Key  string
}

// Empty reports whether no file is named.
func (f Files) Empty() bool { return f.CA == "" && f.Cert == "" && f.Key == "" }

// CommonName is the common name of f.Cert: who a client with it is to etcd
// (with auth on, etcd takes the CN for the user's name) and to the VNAT
// location server.
func (f Files) CommonName() (string, error) {
	c, err := ReadCert(f.Cert)
	if err != nil {
		return "", err
	}
	return c.Subject.CommonName, nil
}

// KeyPair reads the certificate and key (the key checked as a secret).
func (f Files) KeyPair() (tls.Certificate, error) {
	cb, err := os.ReadFile(f.Cert)
	if err != nil {
		return tls.Certificate{}, err
	}
	kb, err := ReadSecret(f.Key)
	if err != nil {
		return tls.Certificate{}, err
	}
	kp, err := tls.X509KeyPair(cb, kb)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certificate %s with key %s: %w", f.Cert, f.Key, err)
	}
	return kp, nil
}

// ServerConfig is the TLS configuration of a server that verifies client
// certificates against f.CA. clientAuth says whether a client must present
// one (etcd) or may (the REST API, which also takes a bearer token).
func (f Files) ServerConfig(clientAuth tls.ClientAuthType) (*tls.Config, error) {
	kp, err := f.KeyPair()
	if err != nil {
		return nil, err
	}
	if err := hasUsage(kp, x509.ExtKeyUsageServerAuth); err != nil {
		return nil, fmt.Errorf("%s: %w", f.Cert, err)
	}
	pool, err := ReadPool(f.CA)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{kp},
		ClientCAs:    pool,
		ClientAuth:   clientAuth,
	}, nil
}

// ClientConfig is the TLS configuration of a client that verifies servers
// against f.CA (the system's roots if f.CA is empty) and presents f.Cert (if
// named) as its identity.
func (f Files) ClientConfig() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		pool, err := ReadPool(f.CA)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = pool
	}
	if f.Cert != "" || f.Key != "" {
		kp, err := f.KeyPair()
		if err != nil {
			return nil, err
		}
		if err := hasUsage(kp, x509.ExtKeyUsageClientAuth); err != nil {
			return nil, fmt.Errorf("%s: %w", f.Cert, err)
		}
		tc.Certificates = []tls.Certificate{kp}
	}
	return tc, nil
}

// hasUsage checks a certificate may be used for u: a certificate made for
// the other side fails only at the peer's handshake, with a vaguer error.
func hasUsage(kp tls.Certificate, u x509.ExtKeyUsage) error {
	c, err := x509.ParseCertificate(kp.Certificate[0])
	if err != nil {
		return err
	}
	if len(c.ExtKeyUsage) == 0 {
		return nil // no restriction
	}
	for _, have := range c.ExtKeyUsage {
		if have == u || have == x509.ExtKeyUsageAny {
			return nil
		}
	}
	name := map[x509.ExtKeyUsage]string{x509.ExtKeyUsageServerAuth: "server", x509.ExtKeyUsageClientAuth: "client"}[u]
	return fmt.Errorf("certificate %q is not for %s authentication (extended key usage)", c.Subject.CommonName, name)
}
