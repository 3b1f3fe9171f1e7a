package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/pki"
	"github.com/onehop/onehop/internal/topology"
)

// Where the units read their files (contrib/systemd) and where `pki ca`
// keeps the CA by default.
const (
	pkiEtcDir = "/etc/onehop"
	pkiCADir  = "/etc/onehop/ca"
)

func pkiCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "pki",
		Short: "Make the CA, the controller's and agents' certificates and the API token (docs/security.md)",
		Long: `Make what the daemons' TLS needs (docs/security.md), with the code the lab uses:
a CA; the controller's certificate (server and client usage, naming the addresses
agents and operators dial); an agent's client certificate whose CN is its node;
the REST API's bearer token. Certificates are written 0644, keys and the token
0600, under the names the systemd units read (/etc/onehop/ca.crt, controller.*,
agent.*, api-token). Any other CA works as well, if its certificates have what
docs/security.md says.`,
		Example: `  onehop pki ca                                   # /etc/onehop/ca/ca.{crt,key}
  onehop pki issue controller --ip 192.168.100.1  # /etc/onehop/{ca,controller}.crt, controller.key
  onehop pki issue agent h1                       # /etc/onehop/agent.{crt,key}, CN h1
  onehop pki issue agent h2 --dir h2              # h2/{ca,agent}.crt, h2/agent.key: copy to h2's /etc/onehop
  onehop pki issue tenant --farm blue             # ./tenant-blue.{crt,key}: blue's tenant only (docs/tenants.md)
  onehop pki token                                # /etc/onehop/api-token`,
	}
	c.AddCommand(pkiCACmd(), pkiIssueCmd(), pkiTokenCmd())
	return c
}

func pkiCACmd() *cobra.Command {
	var dir, name string
	var days int
	var output outputFormat
	c := &cobra.Command{
		Use:   "ca [--dir DIR]",
		Short: "Make a CA: DIR/ca.crt and DIR/ca.key (DIR made 0700); refuses to replace one",
		Long: `Make a self-signed CA that signs the controller's and agents' certificates.
DIR/ca.key signs every certificate of the cloud: keep it where the fabric cannot
reach it. DIR/ca.crt is what every daemon and client trusts. An existing CA is
never replaced (every certificate it signed would stop working): remove it first.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			crt, key := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
			for _, p := range []string{crt, key} {
				if ok, err := exists(p); err != nil || ok {
					return errors.Join(err, fmt.Errorf("%s exists: a new CA would invalidate every certificate the old one signed; remove it first if that is what you want", p))
				}
			}
			if days <= 0 {
				return fmt.Errorf("--days %d: want at least 1", days)
			}
			ca, err := pki.NewCA(name, time.Now(), time.Duration(days)*24*time.Hour)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return fmt.Errorf("ca dir: %w", err)
			}
			if err := ca.Write(crt, key); err != nil {
				return err
			}
			if output == jsonOutput {
				return printJSON(cmd.OutOrStdout(), pkiFiles{What: "ca", Name: name, Cert: crt, Key: key, NotAfter: ca.Cert.NotAfter.UTC()})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "CA %q: %s, %s (until %s)\n", name, crt, key, ca.Cert.NotAfter.UTC().Format(time.DateOnly))
			return nil
		},
	}
	addOutputFlag(c.Flags(), &output)
	c.Flags().StringVar(&dir, "dir", pkiCADir, "directory for ca.crt and ca.key")
	c.Flags().StringVar(&name, "name", "onehop CA", "the CA's common name")
	c.Flags().IntVar(&days, "days", 3650, "validity in days (certificates it signs never outlive it)")
	return c
}

// issueOpts are the flags every `pki issue` kind shares.
type issueOpts struct {
	caDir, dir string
	days       int
	force      bool
	output     outputFormat
}

// pkiFiles is what a pki verb wrote, its -o json.
type pkiFiles struct {
	What     string    `json:"what"` // ca, controller, agent, token
	Name     string    `json:"name,omitempty"`
	Cert     string    `json:"cert,omitempty"`
	Key      string    `json:"key,omitempty"`
	CA       string    `json:"ca,omitempty"`
	Token    string    `json:"token,omitempty"`
	NotAfter time.Time `json:"notAfter,omitzero"`
	// Serial is what `onehop tenant cert revoke` takes.
	Serial string `json:"serial,omitempty"`
}

func (o *issueOpts) flags(c *cobra.Command) {
	c.Flags().StringVar(&o.caDir, "ca-dir", pkiCADir, "directory of the CA's ca.crt and ca.key (onehop pki ca)")
	c.Flags().StringVar(&o.dir, "dir", pkiEtcDir, "directory to write the certificate, its key and ca.crt to")
	c.Flags().IntVar(&o.days, "days", int(pki.DefaultValidity/(24*time.Hour)), "validity in days (at most the CA's)")
	c.Flags().BoolVar(&o.force, "force", false, "replace a certificate and key already there (a running daemon keeps the old ones until it restarts)")
	addOutputFlag(c.Flags(), &o.output)
}

// issue signs req with the CA in o.caDir and writes o.dir/NAME.crt,
// NAME.key and ca.crt, so that o.dir holds all one host needs.
func (o *issueOpts) issue(out io.Writer, name, what string, req pki.Request) error {
	if o.days <= 0 {
		return fmt.Errorf("--days %d: want at least 1", o.days)
	}
	ca, err := pki.LoadCA(filepath.Join(o.caDir, "ca.crt"), filepath.Join(o.caDir, "ca.key"))
	if err != nil {
		return fmt.Errorf("load the CA (onehop pki ca --dir %s makes one): %w", o.caDir, err)
	}
	crt, key, caCrt := filepath.Join(o.dir, name+".crt"), filepath.Join(o.dir, name+".key"), filepath.Join(o.dir, "ca.crt")
	for _, p := range []string{crt, key} {
		if err := refuseExisting(p, o.force); err != nil {
			return err
		}
	}
	// A ca.crt of another CA beside the new certificate would make the
	// daemon distrust its peers: refuse it unless told to replace it.
	caPEM := pki.CertPEM(ca.Cert)
	if have, err := os.ReadFile(caCrt); err == nil && !bytes.Equal(have, caPEM) && !o.force {
		return fmt.Errorf("%s is another CA's certificate than %s: pass --force to replace it", caCrt, filepath.Join(o.caDir, "ca.crt"))
	}
	req.Validity = time.Duration(o.days) * 24 * time.Hour
	p, err := ca.Issue(req, time.Now())
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.dir, 0o700); err != nil {
		return fmt.Errorf("certificate dir: %w", err)
	}
	if err := p.Write(crt, key); err != nil {
		return err
	}
	if err := pki.WriteCert(caCrt, ca.Cert); err != nil {
		return err
	}
	if o.output == jsonOutput {
		return printJSON(out, pkiFiles{What: name, Name: req.CommonName, Cert: crt, Key: key, CA: caCrt, NotAfter: p.Cert.NotAfter.UTC(), Serial: pki.SerialHex(p.Cert)})
	}
	fmt.Fprintf(out, "%s: %s, %s, %s (until %s, serial %s)\n", what, crt, key, caCrt, p.Cert.NotAfter.UTC().Format(time.DateOnly), pki.SerialHex(p.Cert))
	return nil
}

func pkiIssueCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "issue controller|agent|tenant",
		Short: "Issue the controller's, an agent's or a tenant's certificate, signed by the CA",
	}
	var ctl issueOpts
	var ips, dns []string
	controller := &cobra.Command{
		Use:   "controller --ip IP [--ip IP ...] [--dns NAME ...]",
		Short: "The controller's certificate: DIR/controller.crt, controller.key (server and client usage)",
		Long: `The controller's certificate serves etcd's client URL and the REST API and dials
etcd with the same identity, so it has both server and client usage. It must name
every address agents and operators dial: --ip for the fabric address of
--client-url and --api-listen, --dns for names they use instead.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := pki.Request{Kind: pki.Server, CommonName: "controller", DNSNames: dns}
			for _, s := range ips {
				a, err := netip.ParseAddr(s)
				if err != nil {
					return fmt.Errorf("--ip %q: not an IP address", s)
				}
				req.IPs = append(req.IPs, a)
			}
			if len(req.IPs) == 0 && len(req.DNSNames) == 0 {
				return errors.New("controller certificate: give --ip (the fabric address agents dial) or --dns")
			}
			names := append(append([]string{}, ips...), dns...)
			return ctl.issue(cmd.OutOrStdout(), "controller", "controller ("+strings.Join(names, ", ")+")", req)
		},
	}
	ctl.flags(controller)
	controller.Flags().StringSliceVar(&ips, "ip", nil, "an IP address clients dial (repeat or comma-separate)")
	controller.Flags().StringSliceVar(&dns, "dns", nil, "a DNS name clients dial (repeat or comma-separate)")

	var ag issueOpts
	agentC := &cobra.Command{
		Use:   "agent NODE",
		Short: "An agent's client certificate, CN = NODE: DIR/agent.crt, agent.key",
		Long: `An agent's client certificate, whose common name is the node it runs as
(onehop agent --node NODE). Write it where NODE's agent reads it, or to a
directory you copy to NODE's /etc/onehop.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := topology.CheckHostName(args[0]); err != nil {
				return err
			}
			return ag.issue(cmd.OutOrStdout(), "agent", "agent "+args[0], pki.Request{Kind: pki.Client, CommonName: args[0]})
		},
	}
	ag.flags(agentC)

	var tn issueOpts
	var farm string
	tenantC := &cobra.Command{
		Use:   "tenant --farm FARM [--dir DIR]",
		Short: "A tenant's client certificate, O=onehop-tenant, CN=tenant:FARM: DIR/tenant-FARM.crt, .key",
		Long: `A client certificate for the REST API that acts on FARM only (docs/tenants.md):
its subject is O=` + pki.TenantOrganization + `, CN=tenant:FARM. The tenant dials the https API with
--cert, --key and --ca. It is revoked by its serial (printed here) or with every
certificate of its farm: onehop tenant cert revoke; a farm's delete revokes its
tenant's certificates issued until then.`,
		Example: "  onehop pki issue tenant --farm blue --days 30    # ./tenant-blue.{crt,key}, ./ca.crt",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := topology.CheckFarmName(farm); err != nil {
				return fmt.Errorf("--farm: %w", err)
			}
			return tn.issue(cmd.OutOrStdout(), "tenant-"+farm, "tenant of farm "+farm, pki.TenantRequest(farm))
		},
	}
	tn.flags(tenantC)
	tenantC.Flags().Lookup("dir").DefValue, tn.dir = ".", "."
	tenantC.Flags().StringVar(&farm, "farm", "", "the one farm the certificate acts on (required)")
	tenantC.MarkFlagRequired("farm")
	c.AddCommand(controller, agentC, tenantC)
	return c
}

func pkiTokenCmd() *cobra.Command {
	var out string
	var force bool
	var output outputFormat
	c := &cobra.Command{
		Use:   "token [--out FILE]",
		Short: "Make the REST API's bearer token (random, mode 0600)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := refuseExisting(out, force); err != nil {
				return err
			}
			tok, err := pki.NewToken()
			if err != nil {
				return err
			}
			if err := os.MkdirAll(filepath.Dir(out), 0o700); err != nil {
				return fmt.Errorf("token dir: %w", err)
			}
			if err := pki.WriteToken(out, tok); err != nil {
				return err
			}
			if output == jsonOutput {
				return printJSON(cmd.OutOrStdout(), pkiFiles{What: "token", Token: out})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "API token: %s\n", out)
			return nil
		},
	}
	addOutputFlag(c.Flags(), &output)
	c.Flags().StringVar(&out, "out", filepath.Join(pkiEtcDir, "api-token"), "file to write the token to")
	c.Flags().BoolVar(&force, "force", false, "replace a token already there (the controller keeps the old one until it restarts)")
	return c
}

// refuseExisting fails if path exists (unless force): a key or token
// silently replaced breaks whoever still uses the old one.
func refuseExisting(path string, force bool) error {
	ok, err := exists(path)
	if err != nil || !ok || force {
		return err
	}
	return fmt.Errorf("%s exists: pass --force to replace it", path)
}

// exists reports whether path is there (any kind of file).
func exists(path string) (bool, error) {
	_, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}
