package main

// vnatends: the bench's VNAT configurations are held by a helper process,
// `BENCH vnatends ...`, not by the bench itself. internal/vnat enters a
// namespace on a locked OS thread and lets that thread die afterwards (the
// house style for namespaces); in the bench that would be fatal: a thread
// that started a child with Pdeathsig (every iperf3 and rrperf server)
// takes the child with it when it exits, and the servers were killed
// mid-run. The helper has no children to lose.
//
//	vnatends -a NS -ia IF -b NS -ib IF [-move]
//
// loads internal/vnat on both interfaces; with -move, a moves from vnatAv
// to vnatAp (the new address first, then the old one goes), vnatAv is kept
// local (vnat.KeepLocal), the new place's routes are added, and every
// connection a can open to b's servers is translated on both ends. It
// prints "ready", then answers "counters" (one JSON line: the counters of
// a and b) until "quit" or the end of its input, and unloads everything.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/vnat"
)

const vnatEndsArg = "vnatends"

func vnatEndsMain(args []string) int {
	fs := flag.NewFlagSet(vnatEndsArg, flag.ContinueOnError)
	a := fs.String("a", "", "namespace of end a (the one that moves)")
	ia := fs.String("ia", "", "a's interface")
	b := fs.String("b", "", "namespace of end b")
	ib := fs.String("ib", "", "b's interface")
	move := fs.Bool("move", false, "move a and translate every connection it can open to b (VNAT2)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := vnatEnds(*a, *ia, *b, *ib, *move, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "vnatends:", err)
		return 1
	}
	return 0
}

// vnatMigrations are the translations of VNAT2, seen from a and from b:
// each port of a's ephemeral range, TCP and UDP to iperf3, TCP to rrperf.
func vnatMigrations() (ma, mb []vnat.Migration) {
	av, ap, bv := netip.MustParseAddr(vnatAv), netip.MustParseAddr(vnatAp), netip.MustParseAddr(vnatBv)
	for port := vnatPortLo; port <= vnatPortHi; port++ {
		for _, s := range []struct {
			proto vnat.Proto
			port  string
		}{{vnat.TCP, iperfPort}, {vnat.UDP, iperfPort}, {vnat.TCP, rrPort}} {
			sp, _ := strconv.Atoi(s.port)
			lv, lp := netip.AddrPortFrom(av, uint16(port)), netip.AddrPortFrom(ap, uint16(port))
			r := netip.AddrPortFrom(bv, uint16(sp))
			ma = append(ma, vnat.Migration{Virtual: vnat.Virtual{Proto: s.proto, Local: lv, Remote: r}, Physical: vnat.Physical{Proto: s.proto, Local: lp, Remote: r}})
			mb = append(mb, vnat.Migration{Virtual: vnat.Virtual{Proto: s.proto, Local: r, Remote: lv}, Physical: vnat.Physical{Proto: s.proto, Local: r, Remote: lp}})
		}
	}
	return ma, mb
}

// ip runs `ip` steps (a plain child: no Pdeathsig, this process's threads
// come and go).
func ip(steps ...[]string) error {
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(s, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

func vnatEnds(a, ia, b, ib string, move bool, in io.Reader, out io.Writer) (err error) {
	var ds []*vnat.Kernel
	defer func() {
		for _, d := range ds {
			err = errors.Join(err, d.Close())
		}
	}()
	entries := uint32(0)
	if move {
		n := 3 * (vnatPortHi - vnatPortLo + 1)
		entries = uint32(2*n + 1024)
	}
	for _, end := range [][2]string{{a, ia}, {b, ib}} {
		d, err := vnat.Open(vnat.Options{Netns: netns.Path(end[0]), XlateEntries: entries})
		if err != nil {
			return err
		}
		ds = append(ds, d)
		if err := d.AttachInterface(end[1]); err != nil {
			return fmt.Errorf("%s: %w", end[0], err)
		}
	}
	if move {
		// The new address first, then the old one goes: the interface is
		// never without one (which would flush its routes).
		if err := ip([]string{"-n", a, "addr", "add", vnatAp + "/24", "dev", ia},
			[]string{"-n", a, "addr", "del", vnatAv + "/24", "dev", ia}); err != nil {
			return err
		}
		if err := ds[0].KeepLocal(netip.MustParseAddr(vnatAv), ia); err != nil {
			return err
		}
		// The new place's way to b's subnet, with the virtual address as
		// source: the moved end's sockets are bound to it.
		if err := ip([]string{"-n", a, "route", "add", vnatBNet, "dev", ia, "src", vnatAv},
			[]string{"-n", b, "route", "add", vnatANet, "dev", ib}); err != nil {
			return err
		}
		ma, mb := vnatMigrations()
		if err := ds[0].TranslateBatch(ma); err != nil {
			return fmt.Errorf("%s: %w", a, err)
		}
		if err := ds[1].TranslateBatch(mb); err != nil {
			return fmt.Errorf("%s: %w", b, err)
		}
	}
	fmt.Fprintln(out, "ready")
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		switch sc.Text() {
		case "quit":
			return nil
		case "counters":
			cs := map[string]map[string]uint64{}
			for i, d := range ds {
				c, err := d.Counters()
				if err != nil {
					return err
				}
				cs[string(rune('a'+i))] = c
			}
			if err := json.NewEncoder(out).Encode(cs); err != nil {
				return err
			}
		default:
			fmt.Fprintf(out, "unknown command %q\n", sc.Text())
		}
	}
	return sc.Err()
}

// vnatHolder is a running vnatends helper.
type vnatHolder struct{ *helperProc }

// holdVNATEnds starts a vnatends helper for the pair and waits until it is
// ready; cleanup tells it to quit.
func holdVNATEnds(ctx context.Context, e *Env, a, ia, b, ib string, move bool) (*vnatHolder, error) {
	args := []string{"-a", a, "-ia", ia, "-b", b, "-ib", ib}
	if move {
		args = append(args, "-move")
	}
	h, err := startHelper(ctx, e, vnatEndsArg, args...)
	if err != nil {
		return nil, err
	}
	return &vnatHolder{h}, nil
}

// counters are both ends' VNAT counters: "a.NAME", "b.NAME".
func (h *vnatHolder) counters(ctx context.Context) (map[string]float64, error) {
	if _, err := fmt.Fprintln(h.in, "counters"); err != nil {
		return nil, err
	}
	line, err := h.readLine(ctx, 30*time.Second)
	if err != nil {
		return nil, err
	}
	var cs map[string]map[string]uint64
	if err := json.Unmarshal([]byte(line), &cs); err != nil {
		return nil, fmt.Errorf("vnatends counters %q: %w", line, err)
	}
	out := map[string]float64{}
	for end, c := range cs {
		for k, v := range c {
			out[end+"."+k] = float64(v)
		}
	}
	return out, nil
}
