package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/agent"
	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/pki"
)

// tlsFlags adds the TLS flags every daemon takes (named in pki.Flag*).
func tlsFlags(c *cobra.Command, files *pki.Files, insecure *bool, forWhat string) {
	f := c.Flags()
	f.StringVar(&files.CA, strings.TrimPrefix(pki.FlagCA, "--"), "", "CA certificate (PEM) that signed the certificates of "+forWhat)
	f.StringVar(&files.Cert, strings.TrimPrefix(pki.FlagCert, "--"), "", "this daemon's certificate (PEM), signed by --tls-ca")
	f.StringVar(&files.Key, strings.TrimPrefix(pki.FlagKey, "--"), "", "this daemon's private key (PEM, mode 0600)")
	f.BoolVar(insecure, strings.TrimPrefix(pki.FlagInsecure, "--"), false,
		"plain TCP without TLS or client authentication: anyone on the fabric can read and change intent")
}

// addControllerTLSFlags adds the controller's TLS and API authentication flags.
func addControllerTLSFlags(c *cobra.Command, cfg *controller.DaemonConfig) {
	tlsFlags(c, &cfg.TLS, &cfg.Insecure, "agents and API clients; the embedded etcd and the TCP API require one from clients")
	c.Flags().StringVar(&cfg.APITokenFile, "api-token-file", "",
		"file (mode 0600) with a bearer token the TCP API accepts besides client certificates")
	c.Long += `

Everything it serves over TCP is reachable from the fabric, so it serves TLS and
authenticates clients: etcd's client URL (https://) takes only clients with a
certificate signed by --tls-ca (agents), and the REST API on --api-listen takes
a client certificate signed by --tls-ca or the bearer token in --api-token-file.
The same certificate serves and dials etcd, so it needs both server and client
usage and must name the addresses clients dial. The unix sockets (--socket,
--api-socket) are plain and made 0600: only root on this machine may use them.
Without TLS files it refuses to start unless given --insecure.`
	c.Example = `  onehop controller --data-dir /var/lib/onehop/etcd --client-url https://192.168.100.1:2379 \
      --api-listen 192.168.100.1:8443 --api-socket /run/onehop/api.sock \
      --tls-ca /etc/onehop/ca.crt --tls-cert /etc/onehop/controller.crt --tls-key /etc/onehop/controller.key \
      --api-token-file /etc/onehop/api-token
  onehop controller --etcd-endpoints https://10.0.0.5:2379,https://10.0.0.6:2379 --tls-ca ... --tls-cert ... --tls-key ...
  onehop controller --data-dir /tmp/etcd --client-url http://127.0.0.1:2379 --insecure`
}

// addAgentTLSFlags adds the agent's flags for dialing etcd.
func addAgentTLSFlags(c *cobra.Command, cfg *agent.DaemonConfig) {
	tlsFlags(c, &cfg.TLS, &cfg.Insecure, "etcd's servers; --tls-cert is this agent's client certificate (CN = --node)")
	c.Example = `  onehop agent --node h1 --etcd-endpoints https://192.168.100.1:2379 --uplink uplink0 \
      --tls-ca /etc/onehop/ca.crt --tls-cert /etc/onehop/agent-h1.crt --tls-key /etc/onehop/agent-h1.key`
}

// apiTLS holds the root command's flags for an https:// API.
var apiTLS struct {
	ca, cert, key, tokenFile string
}

// addClientTLSFlags adds the operator verbs' credentials for an https API.
func addClientTLSFlags(root *cobra.Command) {
	f := root.PersistentFlags()
	f.StringVar(&apiTLS.ca, "ca", "", "CA certificate the https --api is verified with (default: the lab's when a lab is up)")
	f.StringVar(&apiTLS.cert, "cert", "", "client certificate for the https --api, instead of a token (with --key)")
	f.StringVar(&apiTLS.key, "key", "", "private key of --cert")
	f.StringVar(&apiTLS.tokenFile, "token-file", "", "file with the https --api's bearer token (default: $ONEHOP_TOKEN, else the lab's)")
}

// apiClient returns a client for addr: a unix socket, http://HOST:PORT (a
// controller run with --insecure), or https://HOST:PORT with the CA, token
// and client certificate from the flags, ONEHOP_TOKEN, or else the lab's.
func apiClient(addr string) (*client.Client, error) {
	if !strings.HasPrefix(addr, "https://") {
		return client.New(addr), nil
	}
	c, err := clientCredentials(lab.DefaultRoot, os.Getenv("ONEHOP_TOKEN"))
	if err != nil {
		return nil, err
	}
	tc, err := c.files.ClientConfig()
	if err != nil {
		return nil, err
	}
	return client.NewWith(addr, client.Options{TLS: tc, Token: c.token}), nil
}

type credentials struct {
	files pki.Files
	token string
}

// clientCredentials resolves the https API's credentials: the flags first,
// then envToken, then the files of the lab up under labRoot (if exactly one).
func clientCredentials(labRoot, envToken string) (credentials, error) {
	c := credentials{files: pki.Files{CA: apiTLS.ca, Cert: apiTLS.cert, Key: apiTLS.key}, token: envToken}
	if (c.files.Cert == "") != (c.files.Key == "") {
		return c, errors.New("--cert and --key go together")
	}
	if apiTLS.tokenFile != "" {
		tok, err := pki.ReadToken(apiTLS.tokenFile)
		if err != nil {
			return c, fmt.Errorf("--token-file: %w", err)
		}
		c.token = tok
	}
	if c.files.CA != "" && (c.token != "" || c.files.Cert != "") {
		return c, nil
	}
	name, err := lab.Resolve(labRoot, "")
	if err != nil {
		if c.files.CA == "" && c.token == "" && c.files.Cert == "" {
			return c, fmt.Errorf("https --api needs --ca and --token-file (or ONEHOP_TOKEN) or --cert/--key; no lab to take them from: %w", err)
		}
		return c, nil // what was given; the system's roots verify the controller if no --ca
	}
	st, err := lab.Load(labRoot, name)
	if err != nil {
		return c, err
	}
	if c.files.CA == "" {
		c.files.CA = lab.CAFile(st)
	}
	if c.token == "" && c.files.Cert == "" {
		tok, err := pki.ReadToken(lab.TokenFile(st))
		if err != nil {
			return c, fmt.Errorf("lab %q's API token: %w", name, err)
		}
		c.token = tok
	}
	return c, nil
}
