// Package client talks to the controller's REST API, over a unix socket (the
// lab's default; no credentials, its mode keeps it to root) or HTTPS with a
// bearer token or a client certificate.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Client is a REST API client.
type Client struct {
	base  string
	http  *http.Client
	token string // sent as "Authorization: Bearer" over https only
	// OnAnswer, when set, is handed every successful answer (the CLI's
	// -o json of a verb that changes intent prints them).
	OnAnswer func(method, path string, status int, body []byte)
}

// Options are the credentials for an https:// API.
type Options struct {
	TLS   *tls.Config // the CA to verify the controller with, and a client certificate if any
	Token string      // bearer token
}

// NewWith returns a client for addr with credentials. Over https the
// controller's certificate is verified against o.TLS's CA (the system's
// roots if none) and o.Token is sent; over http:// (a controller run with
// --insecure) and unix sockets no credentials are sent.
func NewWith(addr string, o Options) *Client {
	c := New(addr)
	if strings.HasPrefix(addr, "https://") {
		c.http.Transport = &http.Transport{TLSClientConfig: o.TLS, TLSHandshakeTimeout: 5 * time.Second}
		c.token = o.Token
	}
	return c
}

// New returns a client for addr: a unix socket path, or http://host:port.
func New(addr string) *Client {
	if strings.HasPrefix(addr, "http://") || strings.HasPrefix(addr, "https://") {
		return &Client{base: strings.TrimRight(addr, "/"), http: &http.Client{Timeout: 10 * time.Second}}
	}
	socket := strings.TrimPrefix(addr, "unix://")
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	return &Client{base: "http://onehop", http: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// APIError is an error the API answered with.
type APIError struct {
	Status int
	Field  string `json:"field"`
	Msg    string `json:"error"`
}

func (e *APIError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: %s", e.Field, e.Msg)
	}
	return e.Msg
}

// Stream sends a GET for path and returns the answer's body, to be read
// as it arrives and closed by the caller: no time limit but ctx's (a
// capture runs as long as asked). An answer of 300 or above is the error
// Do would give.
func (c *Client) Stream(ctx context.Context, path string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", c.base+path, nil)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	hc := *c.http
	hc.Timeout = 0
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("controller API unreachable: %w", err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return nil, c.apiError("GET", path, resp.StatusCode, b)
	}
	return resp.Body, nil
}

// apiError is the error of an answer of status 300 or above.
func (c *Client) apiError(method, path string, status int, b []byte) error {
	e := &APIError{Status: status}
	if json.Unmarshal(b, e) != nil || e.Msg == "" {
		e.Msg = fmt.Sprintf("%s %s: HTTP %d %s", method, path, status, strings.TrimSpace(string(b)))
	}
	if status == http.StatusUnauthorized {
		e.Msg = fmt.Sprintf("controller API %s: %s (HTTP 401); give --token-file FILE (or ONEHOP_TOKEN), or --cert and --key signed by its CA", c.base, e.Msg)
	}
	return e
}

// Do sends in (if not nil) as JSON and decodes the answer into out (if not nil).
func (c *Client) Do(method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("controller API unreachable: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if resp.StatusCode >= 300 {
		return c.apiError(method, path, resp.StatusCode, b)
	}
	if c.OnAnswer != nil {
		c.OnAnswer(method, path, resp.StatusCode, b)
	}
	if out != nil && len(b) > 0 {
		return json.Unmarshal(b, out)
	}
	return nil
}
