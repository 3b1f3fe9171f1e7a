package main

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/topology"
)

// Published ports (docs/north-south.md): `vm publish`, `vm unpublish`,
// `vm publications`.

func vmPublishCmd() *cobra.Command {
	var proto string
	var port, public int
	var output outputFormat
	cmd := &cobra.Command{
		Use:   "publish FARM/SUBNET/VM --proto tcp|udp --port N [--public-port M]",
		Short: "Publish a VM's port on its host's address: reached from outside, with the client's own address",
		Long: `Connections to the VM's host's address (its uplink 0) on the public port (default:
the VM's port) reach the VM's port; the VM sees its client's own address, and
its firewall applies. The public port is a lease of the host's address, like a
sliver's ports or an egress slice: refused, naming the holder, when taken. A
tenant publishes from port 1024 up; the operator on any port. A move takes the
publication to the new host's address, same public port (refused when taken
there). Publishing the same proto and port again moves it to the new public port.`,
		Example: "  onehop vm publish blue/web/web1 --proto tcp --port 80 --public-port 8080\n  onehop vm publish blue/web/web1 --proto udp --port 53 --public-port 5353",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if public < 0 || public > 65535 {
				return fmt.Errorf("--public-port %d: want 1..65535 (default: --port)", public)
			}
			p, pub, c, err := publicationArgs(args[0], proto, port)
			if err != nil {
				return err
			}
			pub.PublicPort = uint16(public)
			var v intent.VM
			if err := c.Do("POST", vmPath(p)+"/publications", pub, &v); err != nil {
				return err
			}
			if output == jsonOutput {
				return printJSON(cmd.OutOrStdout(), v)
			}
			for _, got := range v.Published {
				if got.Proto == pub.Proto && got.Port == pub.Port {
					fmt.Fprintf(cmd.OutOrStdout(), "vm %s on %s: published %s\n", v.FullName(), v.Host, got)
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&proto, "proto", "", "tcp or udp")
	cmd.Flags().IntVar(&port, "port", 0, "the VM's port")
	cmd.Flags().IntVar(&public, "public-port", 0, "the port of the host's address (default: --port)")
	addOutputFlag(cmd.Flags(), &output)
	return cmd
}

func vmUnpublishCmd() *cobra.Command {
	var proto string
	var port int
	var output outputFormat
	cmd := &cobra.Command{
		Use:     "unpublish FARM/SUBNET/VM --proto tcp|udp --port N",
		Short:   "Take back a VM's published port (named by the VM's port): the public port is its host's again",
		Example: "  onehop vm unpublish blue/web/web1 --proto tcp --port 80",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, pub, c, err := publicationArgs(args[0], proto, port)
			if err != nil {
				return err
			}
			var v intent.VM
			if err := c.Do("DELETE", vmPath(p)+"/publications/"+pub.Proto+"/"+strconv.Itoa(int(pub.Port)), nil, &v); err != nil {
				return err
			}
			if output == jsonOutput {
				return printJSON(cmd.OutOrStdout(), v)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "vm %s: %s %d unpublished\n", v.FullName(), pub.Proto, pub.Port)
			return nil
		},
	}
	cmd.Flags().StringVar(&proto, "proto", "", "tcp or udp")
	cmd.Flags().IntVar(&port, "port", 0, "the VM's published port")
	addOutputFlag(cmd.Flags(), &output)
	return cmd
}

// publicationArgs checks FARM/SUBNET/VM, --proto and --port as the
// controller does, and opens the API.
func publicationArgs(arg, proto string, port int) ([]string, intent.Publication, *client.Client, error) {
	p, err := vmArg(arg)
	if err != nil {
		return nil, intent.Publication{}, nil, err
	}
	proto = strings.ToLower(proto)
	if proto != "tcp" && proto != "udp" {
		return nil, intent.Publication{}, nil, fmt.Errorf("--proto %q: want tcp or udp", proto)
	}
	if port < 1 || port > 65535 {
		return nil, intent.Publication{}, nil, fmt.Errorf("--port %d: want the VM's port, 1..65535", port)
	}
	c, err := api()
	return p, intent.Publication{Proto: proto, Port: uint16(port)}, c, err
}

func vmPath(p []string) string { return "/v1/farms/" + p[0] + "/subnets/" + p[1] + "/vms/" + p[2] }

// publicationRow is one published port as `vm publications` lists it.
type publicationRow struct {
	VM         string `json:"vm"`
	Host       string `json:"host"`
	Address    string `json:"address"` // the host's address: where clients connect
	Proto      string `json:"proto"`
	Port       uint16 `json:"port"`
	PublicPort uint16 `json:"publicPort"`
}

func vmPublicationsCmd() *cobra.Command {
	var farm string
	var output outputFormat
	cmd := &cobra.Command{
		Use:     "publications [--farm FARM] [-o json]",
		Short:   "List published ports: each VM's port and where it is reached (host address:public port)",
		Example: "  onehop vm publications\n  onehop vm publications --farm blue -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := "/v1/vms"
			if farm != "" {
				if err := topology.CheckFarmName(farm); err != nil {
					return fmt.Errorf("--farm: %w", err)
				}
				path = "/v1/farms/" + farm + "/vms"
			}
			c, err := api()
			if err != nil {
				return err
			}
			rows, err := publications(c, path)
			if err != nil {
				return err
			}
			if output == jsonOutput {
				return printJSON(cmd.OutOrStdout(), rows)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			defer w.Flush()
			fmt.Fprintln(w, "VM\tHOST\tPROTO\tPORT\tPUBLIC")
			for _, r := range rows {
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s:%d\n", r.VM, r.Host, r.Proto, r.Port, r.Address, r.PublicPort)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&farm, "farm", "", "only this farm's")
	addOutputFlag(cmd.Flags(), &output)
	return cmd
}

// publications reads the VMs at path and the hosts' addresses, one row per
// published port.
func publications(c *client.Client, path string) ([]publicationRow, error) {
	var vms []intent.VM
	if err := c.Do("GET", path, nil, &vms); err != nil {
		return nil, err
	}
	var hosts []intent.Host
	if err := c.Do("GET", "/v1/hosts", nil, &hosts); err != nil {
		return nil, err
	}
	addr := map[string]string{}
	for _, h := range hosts {
		addr[h.Name] = h.Address
	}
	rows := []publicationRow{}
	for _, v := range vms {
		for _, p := range v.Published {
			rows = append(rows, publicationRow{VM: v.FullName(), Host: v.Host, Address: addr[v.Host], Proto: p.Proto, Port: p.Port, PublicPort: p.PublicPort})
		}
	}
	return rows, nil
}

// publishedSummary is a VM's published ports for `get vms`: "tcp 80 on
// 8080,udp 53 on 5353", "-" for none.
func publishedSummary(ps []intent.Publication) string {
	if len(ps) == 0 {
		return "-"
	}
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return strings.Join(out, ",")
}
