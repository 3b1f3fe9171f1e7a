package main

import (
	"cmp"
	"fmt"
	"io"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/pki"
	"github.com/onehop/onehop/internal/topology"
)

func tenantCmd() *cobra.Command {
	tenant := &cobra.Command{
		Use:   "tenant",
		Short: "Tenants' credentials: tokens scoped to one farm, and certificates' revocations (docs/tenants.md)",
		Long: `A tenant's credential acts on one farm only: everything on its own farm, 403 on
any other farm's objects and on the operator's operations. Two kinds exist: a
bearer token made here, and a client certificate naming the farm
('onehop pki issue tenant --farm FARM'). Tokens are an admin's to make, list and
revoke; certificates an admin's to revoke (by serial, or all of a farm's until
now). A revoked credential is answered 401 at once.`,
	}
	token := &cobra.Command{Use: "token", Short: "Make, list and revoke tenant tokens"}
	var out, farmFilter string
	var force bool
	var createOutput outputFormat
	create := &cobra.Command{
		Use:   "create --farm FARM [--out FILE] [-o json]",
		Short: "Make a token for FARM's tenant; it is shown once (or written to --out, mode 0600)",
		Long: `Make a bearer token scoped to FARM. The controller keeps only its SHA-256: the
token is printed this once (or written to --out, mode 0600), so hand it to the
tenant now. The tenant uses it as any token: --token-file FILE or ONEHOP_TOKEN.
With -o json it prints the token's id, farm and created, and the token itself
only when there is no --out; with --out the JSON names the file instead.`,
		Example: "  onehop tenant token create --farm blue\n  onehop tenant token create --farm blue --out blue.token",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := topology.CheckFarmName(farmFilter); err != nil {
				return fmt.Errorf("--farm: %w", err)
			}
			if out != "" {
				if err := refuseExisting(out, force); err != nil {
					return err
				}
			}
			c, err := api()
			if err != nil {
				return err
			}
			var t controller.NewTenantToken
			if err := c.Do("POST", "/v1/tenants/tokens", map[string]string{"farm": farmFilter}, &t); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if out == "" {
				if createOutput == jsonOutput {
					return printJSON(w, createdToken{TenantToken: t.TenantToken, Token: t.Token})
				}
				fmt.Fprintf(w, "token %s for farm %s (shown once; keep it):\n%s\n", t.ID, t.Farm, t.Token)
				return nil
			}
			if err := pki.WriteToken(out, t.Token); err != nil {
				return fmt.Errorf("token %s was made but not written (revoke it: onehop tenant token revoke %s): %w", t.ID, t.ID, err)
			}
			if createOutput == jsonOutput {
				return printJSON(w, createdToken{TenantToken: t.TenantToken, File: out})
			}
			fmt.Fprintf(w, "token %s for farm %s: %s\n", t.ID, t.Farm, out)
			return nil
		},
	}
	// Its own -o, not answerAsJSON's: the controller's answer holds the
	// token, which must not be printed when it went to --out.
	addOutputFlag(create.Flags(), &createOutput)
	create.Flags().StringVar(&farmFilter, "farm", "", "the one farm the token acts on (required)")
	create.Flags().StringVar(&out, "out", "", "write the token to this file (mode 0600) instead of printing it")
	create.Flags().BoolVar(&force, "force", false, "replace --out if it exists")
	create.MarkFlagRequired("farm")

	var output outputFormat
	var listFarm string
	list := &cobra.Command{
		Use:   "list [--farm FARM] [-o json]",
		Short: "List tenant tokens: id, farm, created (never a secret)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var toks []controller.TenantToken
			if err := getOfFarm("/v1/tenants/tokens", listFarm, &toks); err != nil {
				return err
			}
			return printTokens(cmd.OutOrStdout(), toks, output)
		},
	}
	list.Flags().StringVar(&listFarm, "farm", "", "this farm's tokens only")
	addOutputFlag(list.Flags(), &output)

	revoke := &cobra.Command{
		Use:     "revoke ID",
		Short:   "Revoke a token: from now on it is answered 401",
		Example: "  onehop tenant token list --farm blue\n  onehop tenant token revoke 3f2a9c1d0b7e4a65",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := api()
			if err != nil {
				return err
			}
			if err := c.Do("DELETE", "/v1/tenants/tokens/"+url.PathEscape(args[0]), nil, nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "token %s revoked\n", args[0])
			return nil
		},
	}
	token.AddCommand(create, list, revoke)
	tenant.AddCommand(token, tenantCertCmd())
	return tenant
}

// createdToken is what token create -o json prints: the record, and either
// the token (printed this once) or the file it was written to, never both.
type createdToken struct {
	controller.TenantToken
	Token string `json:"token,omitempty"`
	File  string `json:"file,omitempty"`
}

func printTokens(w io.Writer, toks []controller.TenantToken, output outputFormat) error {
	if output == jsonOutput {
		return printJSON(w, toks)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tFARM\tCREATED")
	for _, t := range toks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", t.ID, t.Farm, t.Created.Local().Format(time.DateTime))
	}
	return tw.Flush()
}

// tenantCertCmd revokes tenant certificates (docs/tenants.md): the CA
// issues them offline and keeps no list, so the controller keeps the
// revocations and refuses what they name.
func tenantCertCmd() *cobra.Command {
	cert := &cobra.Command{Use: "cert", Short: "Revoke tenant certificates, and list the revocations"}
	var serial, certFile, farm string
	revoke := &cobra.Command{
		Use:   "revoke (--serial HEX | --cert FILE | --farm FARM)",
		Short: "Revoke a tenant certificate, or every certificate of a farm issued until now: 401 from then on",
		Long: `Revoke a tenant's client certificate before it expires. Name it by its serial
(as 'onehop pki issue tenant' or 'openssl x509 -serial' prints it; colons are
fine) or by its file (--cert, which needs no key). --farm alone revokes every
certificate of the farm's tenant issued until now (to the second), for a lost
key whose serial nobody noted; certificates issued after are not touched.
A farm's delete does the same for its farm. The controller refuses a revoked
certificate from the next request; another controller on the same etcd as
soon as its watch sees the record.`,
		Example: "  onehop tenant cert revoke --serial 3a:5b:07:11\n  onehop tenant cert revoke --cert tenant-blue.crt\n  onehop tenant cert revoke --farm blue",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var in controller.CertRevocation
			switch {
			case countSet(serial, certFile, farm) != 1:
				return fmt.Errorf("name exactly one of --serial, --cert and --farm")
			case serial != "":
				s, err := pki.ParseSerial(serial)
				if err != nil {
					return fmt.Errorf("--serial: %w", err)
				}
				in.Serial = s
			case certFile != "":
				c, err := pki.ReadCert(certFile)
				if err != nil {
					return fmt.Errorf("--cert: %w", err)
				}
				f, ok := pki.TenantFarm(c)
				if !ok {
					return fmt.Errorf("--cert %s: %q is not a tenant's certificate (O=%s): an admin's is revoked by a new CA", certFile, c.Subject.CommonName, pki.TenantOrganization)
				}
				in.Serial, in.Farm, in.Expires = pki.SerialHex(c), f, c.NotAfter.UTC()
			default:
				if err := topology.CheckFarmName(farm); err != nil {
					return fmt.Errorf("--farm: %w", err)
				}
				in.Farm = farm
			}
			c, err := api()
			if err != nil {
				return err
			}
			var out controller.CertRevocation
			if err := c.Do("POST", "/v1/tenants/cert-revocations", in, &out); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if out.Serial != "" {
				fmt.Fprintf(w, "tenant certificate serial %s revoked\n", out.Serial)
			} else {
				fmt.Fprintf(w, "farm %s's tenant certificates issued until %s revoked\n", out.Farm, out.Revoked.Format(time.RFC3339))
			}
			return nil
		},
	}
	revoke.Flags().StringVar(&serial, "serial", "", "the certificate's serial number, hex")
	revoke.Flags().StringVar(&certFile, "cert", "", "the certificate's file (PEM)")
	revoke.Flags().StringVar(&farm, "farm", "", "every certificate of this farm's tenant issued until now")

	var output outputFormat
	var listFarm string
	list := &cobra.Command{
		Use:   "list [--farm FARM] [-o json]",
		Short: "List the revoked tenant certificates: by serial, and by farm with the time",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var revs []controller.CertRevocation
			if err := getOfFarm("/v1/tenants/cert-revocations", listFarm, &revs); err != nil {
				return err
			}
			if output == jsonOutput {
				return printJSON(cmd.OutOrStdout(), revs)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SERIAL\tFARM\tREVOKED\tEXPIRES")
			for _, r := range revs {
				s, exp := r.Serial, "-"
				if s == "" {
					s = "(all issued until then)"
				}
				if !r.Expires.IsZero() {
					exp = r.Expires.Local().Format(time.DateTime)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s, cmp.Or(r.Farm, "-"), r.Revoked.Local().Format(time.DateTime), exp)
			}
			return tw.Flush()
		},
	}
	list.Flags().StringVar(&listFarm, "farm", "", "this farm's revocations only")
	addOutputFlag(list.Flags(), &output)
	cert.AddCommand(revoke, list)
	return cert
}

// countSet is how many of vals are not empty.
func countSet(vals ...string) int {
	n := 0
	for _, v := range vals {
		if v != "" {
			n++
		}
	}
	return n
}
