package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/topology"
)

func vmCmd() *cobra.Command {
	vm := &cobra.Command{Use: "vm", Short: "VMs: an address in a subnet, placed on a host"}
	vm.AddCommand(vmCreateCmd(), vmMoveCmd(), vmDeleteCmd(), vmGetCmd(), vmPublishCmd(), vmUnpublishCmd(), vmPublicationsCmd(),
		listCmd("VMs with their hosts, addresses, MACs and vifs", "/v1/vms", func(farm string) string { return "/v1/farms/" + farm + "/vms" }, printVMs))
	return vm
}

func vmCreateCmd() *cobra.Command {
	var host, iface string
	vmCreate := &cobra.Command{
		Use: "create FARM/SUBNET/VM --host HOST [--interface IFNAME]", Short: "Create a VM and allocate its 10.f.s.h and virtual MAC", Args: cobra.ExactArgs(1),
		Long: `Records the VM on HOST and allocates its address and virtual MAC. --interface
names the host interface that carries the guest: the tap QEMU or libvirt opens,
or the host end of a veth (default vif-VM-HASH, from the farm and VM: a VM's
name is unique within its farm only). The agent attaches to it whatever
its kind (veth or tap) and delivers to it as that kind takes frames
(docs/guests.md).`,
		Example: "  onehop vm create blue/web/web4 --host h2\n  onehop vm create blue/web/qemu1 --host h2 --interface tap-qemu1",
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := vmArg(args[0])
			if err != nil {
				return err
			}
			if host == "" {
				return fmt.Errorf("--host is required: the host the VM runs on")
			}
			if cmd.Flags().Changed("interface") {
				if err := intent.CheckInterface("--interface", iface); err != nil {
					return err
				}
			}
			c, err := api()
			if err != nil {
				return err
			}
			var v intent.VM
			if err := c.Do("POST", "/v1/farms/"+p[0]+"/subnets/"+p[1]+"/vms", map[string]string{"name": p[2], "host": host, "interface": iface}, &v); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "vm %s on %s: %s, MAC %s, gateway %s, vif %s\n", v.FullName(), v.Host, v.IP, v.MAC, v.Gateway, v.Interface)
			return nil
		},
	}
	vmCreate.Flags().StringVar(&host, "host", "", "host the VM runs on")
	vmCreate.Flags().StringVar(&iface, "interface", "", "host interface that carries the guest: a tap or a veth's host end (default vif-VM-HASH, from farm and VM)")
	return vmCreate
}

func vmMoveCmd() *cobra.Command {
	var moveTo, subnet string
	vmMove := &cobra.Command{
		Use:   "move FARM/SUBNET/VM --to HOST [--subnet FARM/SUBNET]",
		Short: "Record that a VM now runs on HOST (address and MAC stay); every host's table follows",
		Long: `Tells the controller only. Whatever migrates the VM (the hypervisor; in the lab,
'onehop lab move', which also calls this) plugs its vif in on HOST.

With --subnet (another subnet of the VM's farm) the VM gets a new address, MAC
and gateway in that subnet and its old address is freed; the guest must take
the new address (in the lab, 'onehop lab move --subnet' does that).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := vmArg(args[0])
			if err != nil {
				return err
			}
			if moveTo == "" {
				return fmt.Errorf("--to is required: the host the VM now runs on")
			}
			c, err := api()
			if err != nil {
				return err
			}
			body := map[string]string{"host": moveTo}
			if subnet != "" {
				body["subnet"] = subnet
			}
			var v intent.VM
			if err := c.Do("PUT", "/v1/farms/"+p[0]+"/subnets/"+p[1]+"/vms/"+p[2]+"/host", body, &v); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "vm %s now on %s (%s, MAC %s, gateway %s)\n", v.FullName(), v.Host, v.IP, v.MAC, v.Gateway)
			return nil
		},
	}
	vmMove.Flags().StringVar(&moveTo, "to", "", "the host the VM now runs on")
	vmMove.Flags().StringVar(&subnet, "subnet", "", "FARM/SUBNET: move it to this subnet of its farm too (a new address there)")
	return vmMove
}

// vmArg checks FARM/SUBNET/VM with the controller's name checks.
func vmArg(arg string) ([]string, error) {
	return nameArg(arg, "FARM/SUBNET/VM", topology.CheckFarmName, topology.CheckSubnetName, topology.CheckVMName)
}

func vmDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use: "delete FARM/SUBNET/VM", Short: "Delete a VM and free its address (the next VM of the subnet may get it)", Args: cobra.ExactArgs(1),
		Long: `Deletes the VM's record; its host's agent drops its entries, and its address is
free for the next VM of its subnet. A TAP policy naming it stays, and copies
nothing until a VM of that name is back (onehop tap list says so).`,
		Example: "  onehop vm delete blue/web/web4",
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := vmArg(args[0])
			if err != nil {
				return err
			}
			return deleteOne(cmd, "/v1/farms/"+p[0]+"/subnets/"+p[1]+"/vms/"+p[2], false, "vm "+args[0])
		},
	}
}

func vmGetCmd() *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use: "get FARM/SUBNET/VM [-o json]", Short: "Show one VM: its host, address, MAC, vif and firewall", Args: cobra.ExactArgs(1),
		Example: "  onehop vm get blue/web/web1\n  onehop vm get blue/web/web1 -o json",
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := vmArg(args[0])
			if err != nil {
				return err
			}
			return showOne(cmd, "/v1/farms/"+p[0]+"/subnets/"+p[1]+"/vms/"+p[2], output, func(v intent.VM) string {
				s := fmt.Sprintf("vm %s on %s: %s, MAC %s, gateway %s, vif %s, firewall %s, egress %s", v.FullName(), v.Host, v.IP, v.MAC, v.Gateway, v.Interface, firewallSummary(v.Firewall), egressSummary(v.Egress))
				if len(v.Published) > 0 {
					s += ", published " + publishedSummary(v.Published)
				}
				if v.Floating != "" {
					s += ", floating " + v.Floating
				}
				return s + "\n"
			})
		},
	}
	addOutputFlag(cmd.Flags(), &output)
	return cmd
}

func firewallSummary(fw *intent.Firewall) string {
	if fw == nil {
		return "-"
	}
	return fmt.Sprintf("in %s, out %s, %d rules", fw.DefaultIn, fw.DefaultOut, len(fw.Rules))
}

// egressSummary is a VM's egress slice: ports LO-HI of its host's address
// (docs/north-south.md), "-" when its farm has egress off.
func egressSummary(e *intent.VMEgress) string {
	if e == nil {
		return "-"
	}
	return fmt.Sprintf("slice %d-%d", e.Slice.Lo, e.Slice.Hi)
}

func printVMs(c *client.Client, path string, output outputFormat, w io.Writer) error {
	return listAndPrint(c, path, output, w, "VM\tHOST\tIP\tMAC\tVIF\tFIREWALL\tEGRESS\tPUBLISHED\tFLOATING", func(v intent.VM) string {
		return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", v.FullName(), v.Host, v.IP, v.MAC, v.Interface, firewallSummary(v.Firewall), egressSummary(v.Egress), publishedSummary(v.Published), orDash(v.Floating))
	})
}

var vmListing = listing{kind: "vms", print: func(c *client.Client, output outputFormat, w io.Writer) error {
	return printVMs(c, "/v1/vms", output, w)
}}
