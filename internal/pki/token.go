package pki

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"strings"
)

// MinTokenLength is the shortest bearer token accepted: shorter ones can be
// guessed by anyone on the fabric who keeps trying.
const MinTokenLength = 16

// NewToken returns a random bearer token (32 bytes, hex).
func NewToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// WriteToken writes a token to path with mode 0600.
func WriteToken(path, token string) error {
	return writeFile(path, []byte(token+"\n"), 0o600)
}

// ReadToken reads a bearer token from path: its first line, trimmed. The
// file must not be readable by group or others and the token must be at
// least MinTokenLength characters of printable ASCII (it travels in an HTTP
// header).
func ReadToken(path string) (string, error) {
	b, err := ReadSecret(path)
	if err != nil {
		return "", err
	}
	tok, _, _ := strings.Cut(string(b), "\n")
	tok = strings.TrimSpace(tok)
	if len(tok) < MinTokenLength {
		return "", fmt.Errorf("%s: token has %d characters, want at least %d", path, len(tok), MinTokenLength)
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] <= ' ' || tok[i] > '~' {
			return "", fmt.Errorf("%s: token has a character that is not printable ASCII at offset %d", path, i)
		}
	}
	return tok, nil
}

// TokenMatches compares a presented token with the expected one in constant
// time, so the time an answer takes says nothing about how much matched.
func TokenMatches(want, got string) bool {
	// Hashing first makes the comparison's time independent of the
	// lengths too.
	w, g := sha256.Sum256([]byte(want)), sha256.Sum256([]byte(got))
	return want != "" && subtle.ConstantTimeCompare(w[:], g[:]) == 1
}
