package main

import (
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/intent"
)

const floatingLong = `A floating address is a fabric address from the operator's pool, attached to
one VM: the world reaches the VM on it whole (every port and protocol), and the
VM's packets outside the tenant space leave with it as their source, ports
untouched. The host the VM lives on answers ARP for it; a live move of the VM
takes it along (the new host announces it with a gratuitous ARP), so
connections through it survive the move. The pool and its attachments are the
operator's. docs/north-south.md has the details.`

func floatingCmd() *cobra.Command {
	c := &cobra.Command{Use: "floating", Short: "The operator's pool of floating addresses, and which VM holds each", Long: floatingLong,
		Example: `  onehop floating create 192.168.100.50
  onehop floating attach 192.168.100.50 blue/web/web1
  onehop floating list
  onehop floating detach 192.168.100.50
  onehop floating delete 192.168.100.50`}
	c.AddCommand(floatingCreateCmd(), floatingDeleteCmd(), floatingAttachCmd(), floatingDetachCmd(), floatingListCmd())
	return c
}

// floatingArg reads ADDRESS, the first argument of every verb.
func floatingArg(s string) (string, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return "", fmt.Errorf("ADDRESS %q: want an IPv4 address on the fabric, such as 192.168.100.50", s)
	}
	return a.String(), nil
}

// describeFloating is an address and its holder in a line.
func describeFloating(f intent.FloatingAddress) string {
	if f.VM == "" {
		return fmt.Sprintf("floating %s: free", f.Address)
	}
	return fmt.Sprintf("floating %s: vm %s on %s", f.Address, f.VM, f.Host)
}

func floatingCreateCmd() *cobra.Command {
	return &cobra.Command{
		Use: "create ADDRESS", Short: "Add a fabric address to the pool", Long: floatingLong + `

ADDRESS must be outside the tenant space, on a host's fabric subnet, and no
host's own address.`,
		Example: "  onehop floating create 192.168.100.50", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return floatingDo(cmd, "POST", "/v1/floating", args[0], controller.FloatingBody{})
		},
	}
}

func floatingDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use: "delete ADDRESS", Short: "Take an address out of the pool (detach it first)", Args: cobra.ExactArgs(1),
		Example: "  onehop floating delete 192.168.100.50",
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := floatingArg(args[0])
			if err != nil {
				return err
			}
			return deleteOne(cmd, "/v1/floating/"+a, false, "floating "+a)
		},
	}
}

func floatingAttachCmd() *cobra.Command {
	return &cobra.Command{
		Use: "attach ADDRESS FARM/SUBNET/VM", Short: "Give a pool address to a VM", Long: floatingLong + `

Refused (409, naming the holder) while another VM holds the address, and while
the VM holds another.`,
		Example: "  onehop floating attach 192.168.100.50 blue/web/web1", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := vmArg(args[1]); err != nil {
				return err
			}
			return floatingDo(cmd, "PUT", "/v1/floating/{}/vm", args[0], controller.FloatingAttachBody{VM: args[1]})
		},
	}
}

func floatingDetachCmd() *cobra.Command {
	return &cobra.Command{
		Use: "detach ADDRESS", Short: "Take a floating address from its VM", Args: cobra.ExactArgs(1),
		Example: "  onehop floating detach 192.168.100.50",
		RunE: func(cmd *cobra.Command, args []string) error {
			return floatingDo(cmd, "DELETE", "/v1/floating/{}/vm", args[0], nil)
		},
	}
}

// floatingDo sends one change about address (path's {} is it; a create's
// body takes it) and prints the address as the controller answered.
func floatingDo(cmd *cobra.Command, method, path, address string, body any) error {
	a, err := floatingArg(address)
	if err != nil {
		return err
	}
	if b, ok := body.(controller.FloatingBody); ok {
		b.Address = a
		body = b
	}
	c, err := api()
	if err != nil {
		return err
	}
	var f intent.FloatingAddress
	if err := c.Do(method, strings.Replace(path, "{}", a, 1), body, &f); err != nil {
		return err
	}
	fmt.Fprintln(cmd.OutOrStdout(), describeFloating(f))
	return nil
}

func floatingListCmd() *cobra.Command {
	cmd := listCmd("the pool: each address and the VM (and host) holding it", "/v1/floating", nil,
		func(c *client.Client, _ string, output outputFormat, w io.Writer) error {
			return printFloating(c, output, w)
		})
	cmd.Example = "  onehop floating list\n  onehop floating list -o json"
	return cmd
}

func printFloating(c *client.Client, output outputFormat, w io.Writer) error {
	return listAndPrint(c, "/v1/floating", output, w, "ADDRESS\tVM\tHOST", func(f intent.FloatingAddress) string {
		vm, host := f.VM, f.Host
		if vm == "" {
			vm, host = "-", "-"
		}
		return fmt.Sprintf("%s\t%s\t%s", f.Address, vm, host)
	})
}

var floatingListing = listing{kind: "floating", print: func(c *client.Client, output outputFormat, w io.Writer) error {
	return printFloating(c, output, w)
}}
