package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/addrplan"
)

func TestVMAddressesFollowFarmSubnetHostOrder(t *testing.T) {
	var a Allocations
	cases := []struct{ farm, subnet, vm, want string }{
		{"blue", "web", "web1", "10.1.1.2"},
		{"blue", "web", "web2", "10.1.1.3"},
		{"blue", "db", "db1", "10.1.2.2"},
		{"red", "web", "red1", "10.2.1.2"},
		{"blue", "web", "web1", "10.1.1.2"}, // stable on repeat
	}
	for _, c := range cases {
		got, err := a.VM(c.farm, c.subnet, c.vm)
		if err != nil {
			t.Fatalf("%s/%s/%s: %v", c.farm, c.subnet, c.vm, err)
		}
		if got.String() != c.want {
			t.Errorf("%s/%s/%s = %s, want %s", c.farm, c.subnet, c.vm, got, c.want)
		}
	}
}

func TestFreedIDIsReusedAndOthersKeepTheirs(t *testing.T) {
	var a Allocations
	for i := 1; i <= 3; i++ {
		if _, err := a.VM("f", "s", fmt.Sprint("vm", i)); err != nil {
			t.Fatal(err)
		}
	}
	delete(a.VMs, "f/s/vm2")
	got, _ := a.VM("f", "s", "new")
	if got.String() != "10.1.1.3" {
		t.Fatalf("new VM got %s, want the freed 10.1.1.3", got)
	}
	if got, _ := a.VM("f", "s", "vm3"); got.String() != "10.1.1.4" {
		t.Fatalf("vm3 moved to %s", got)
	}
}

func TestSubnetRunsOutOfHostIDs(t *testing.T) {
	var a Allocations
	for i := 0; i < 253; i++ {
		if _, err := a.VM("f", "s", fmt.Sprint("vm", i)); err != nil {
			t.Fatalf("vm %d: %v", i, err)
		}
	}
	if _, err := a.VM("f", "s", "one-too-many"); err == nil {
		t.Fatal("254th VM in a /24 was allocated; want an error")
	}
}

func TestVirtualMACIsDerivedFromAddress(t *testing.T) {
	if got := VirtualMAC(Address(3, 4, 5)).String(); got != "02:00:0a:03:04:05" {
		t.Fatalf("got %s", got)
	}
	if got := Gateway(3, 4).String(); got != "10.3.4.1" {
		t.Fatalf("gateway %s", got)
	}
}

// Each id range that runs out says so with ErrExhausted (the API answers 409)
// and with its size and "0 left", not a bare failure.
func TestRunningOutOfIDsSaysWhichRangeAndHowManyAreLeft(t *testing.T) {
	var a Allocations
	for i := 0; i < 255; i++ {
		if _, err := a.Farm(fmt.Sprint("f", i)); err != nil {
			t.Fatalf("farm %d: %v", i, err)
		}
	}
	_, err := a.Farm("f255")
	checkExhausted(t, err, `farm "f255": no free id left for a farm: all 255 of 1..255 are in use, 0 left`)

	for i := 0; i < 255; i++ {
		if _, err := a.Subnet("f0", fmt.Sprint("s", i)); err != nil {
			t.Fatalf("subnet %d: %v", i, err)
		}
	}
	_, err = a.Subnet("f0", "s255")
	checkExhausted(t, err, `subnet "f0/s255": no free id left for a subnet in farm f0: all 255 of 1..255 are in use, 0 left`)

	for i := 0; i < 253; i++ {
		if _, err := a.VM("f1", "s", fmt.Sprint("vm", i)); err != nil {
			t.Fatalf("vm %d: %v", i, err)
		}
	}
	_, err = a.VM("f1", "s", "vm253")
	checkExhausted(t, err, `vm "f1/s/vm253": no free id left for a VM in subnet f1/s: all 253 of 2..254 are in use, 0 left`)
}

func checkExhausted(t *testing.T, err error, want string) {
	t.Helper()
	if !errors.Is(err, ErrExhausted) || err.Error() != want {
		t.Errorf("err = %v, want %q wrapping ErrExhausted", err, want)
	}
}

// TestVMExceptSkipsHeldAddresses: a new VM never gets an address another
// endpoint still holds (§3.4.2), a VM that has one keeps it, and held
// addresses of other subnets change nothing.
func TestVMExceptSkipsHeldAddresses(t *testing.T) {
	var a Allocations
	web1, err := a.VM("blue", "web", "web1")
	if err != nil || web1 != netip.MustParseAddr("10.1.1.2") {
		t.Fatalf("web1: %v %v", web1, err)
	}
	delete(a.VMs, "blue/web/web1") // web1 moved away; 10.1.1.2 is free again...
	held := map[netip.Addr]bool{web1: true, netip.MustParseAddr("10.1.9.2"): true, netip.MustParseAddr("10.2.1.3"): true}
	got, err := a.VMExcept("blue", "web", "db1", held) // ...but still held
	if err != nil || got != netip.MustParseAddr("10.1.1.3") {
		t.Fatalf("db1 with 10.1.1.2 held: %v %v, want 10.1.1.3", got, err)
	}
	if again, _ := a.VMExcept("blue", "web", "db1", map[netip.Addr]bool{got: true}); again != got {
		t.Fatalf("db1 asked again with its own address held: %v, want it kept (%v)", again, got)
	}
	if free, _ := a.VM("blue", "web", "app1"); free != web1 {
		t.Fatalf("with nothing held the lowest free is %v, want %v", free, web1)
	}
}

// TestVMExceptCountsHeldAddressesAsTaken: a subnet whose free ids are all
// held is full.
func TestVMExceptCountsHeldAddressesAsTaken(t *testing.T) {
	var a Allocations
	held := map[netip.Addr]bool{}
	for h := minVMID; h <= int(addrplan.Current().MaxHost()); h++ {
		held[Address(1, 1, uint32(h))] = true
	}
	if _, err := a.VMExcept("blue", "web", "x", held); !errors.Is(err, ErrExhausted) {
		t.Fatalf("every id held: %v, want ErrExhausted", err)
	}
}

func TestTwelveSixSixPlanAllocatesFarm300AndItsSubnetsVMs(t *testing.T) {
	if err := addrplan.Set(addrplan.MustParse("10.0.0.0/8:12/6/6")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { addrplan.Set(addrplan.Default()) })
	var a Allocations
	for i := 1; i < 300; i++ {
		if _, err := a.Farm(fmt.Sprintf("f%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if id, err := a.Farm("big"); err != nil || id != 300 {
		t.Fatalf("the 300th farm: id %d, %v", id, err)
	}
	ip, err := a.VM("big", "web", "w1")
	if err != nil || ip != netip.MustParseAddr("10.18.192.66") {
		t.Fatalf("first VM of farm 300 subnet 1: %v, %v (want 10.18.192.66: 300<<12 | 1<<6 | 2)", ip, err)
	}
	if gw := Gateway(300, 1); gw != netip.MustParseAddr("10.18.192.65") {
		t.Fatalf("gateway %v", gw)
	}
	for i := 0; i < 60; i++ {
		if _, err := a.VM("big", "web", fmt.Sprintf("more%d", i)); err != nil {
			t.Fatalf("VM %d of 61: %v", i+2, err)
		}
	}
	_, err = a.VM("big", "web", "onetoomany")
	if !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "all 61 of 2..62") {
		t.Fatalf("the 62nd VM of a 6-bit subnet: %v", err)
	}
}
